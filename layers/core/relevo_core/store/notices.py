"""Access pattern: once-per-transition markers and "only on change" suppression windows.

A marker is one conditional put (DynamoDB Developer Guide, "Condition expressions": PutItem with
`attribute_not_exists(pk)` fails with ConditionalCheckFailedException when the item exists), so a
stream record delivered twice, or two records of one transition, send at most once. A claim that
was taken and never finished (the invocation died mid-send) may be taken again once its
`claimed_until` passed; a finished one (sent, dead-lettered) never is.
"""

from __future__ import annotations

from botocore.exceptions import ClientError

from relevo_core.aws import client, error_code
from relevo_core.store.codec import to_attributes
from relevo_core.store.conditional import delete_if, update_if
from relevo_core.store.keys import SUPPRESSION_SK, key, notice_pk, notice_sk, suppression_pk

CLAIMED = "claimed"


def claim_notice(
    table: str, subject: str, target: str, transition: str, now: int, claim_sec: int, ttl: int
) -> bool:
    """True when this caller is the one to send `transition` to `target` for the job."""
    try:
        client("dynamodb").put_item(
            TableName=table,
            Item=to_attributes(
                {
                    "pk": notice_pk(subject),
                    "sk": notice_sk(target, transition),
                    "state": CLAIMED,
                    "claimed_until": now + claim_sec,
                    "ttl": ttl,
                }
            ),
            ConditionExpression="attribute_not_exists(pk) OR (#state = :claimed AND claimed_until < :now)",
            ExpressionAttributeNames={"#state": "state"},
            ExpressionAttributeValues={":claimed": {"S": CLAIMED}, ":now": {"N": str(now)}},
        )
    except ClientError as exc:
        if error_code(exc) == "ConditionalCheckFailedException":
            return False
        raise
    return True


def release_notice(table: str, subject: str, target: str, transition: str) -> None:
    """A claim given back before anything was sent under it (its invocation failed first): the
    stream delivers the record again within seconds, and finds the marker gone. Only a claim still
    standing is removed; a finished marker stays."""
    delete_if(
        TableName=table,
        Key=key(notice_pk(subject), notice_sk(target, transition)),
        ConditionExpression="#state = :claimed",
        ExpressionAttributeNames={"#state": "state"},
        ExpressionAttributeValues={":claimed": {"S": CLAIMED}},
    )


def finish_notice(table: str, subject: str, target: str, transition: str, outcome: str) -> None:
    """The claim's end: `sent` or `dead_lettered`; either way it is never taken again."""
    client("dynamodb").update_item(
        TableName=table,
        Key=key(notice_pk(subject), notice_sk(target, transition)),
        UpdateExpression="SET #state = :outcome REMOVE claimed_until",
        ExpressionAttributeNames={"#state": "state"},
        ExpressionAttributeValues={":outcome": {"S": outcome}},
    )


def open_window(table: str, subject: str, now: int, window_sec: int) -> bool:
    """True when no window for `subject` is open (and opens one for `window_sec`); False while one
    is. DynamoDB's TTL deletes expired items only eventually (days, "Using time to live"), so the
    condition compares `until` itself rather than relying on the item being gone."""
    until = now + window_sec
    return update_if(
        TableName=table,
        Key=key(suppression_pk(subject), SUPPRESSION_SK),
        UpdateExpression="SET #until = :until, #ttl = :until",
        ConditionExpression="attribute_not_exists(pk) OR #until <= :now",
        ExpressionAttributeNames={"#until": "until", "#ttl": "ttl"},
        ExpressionAttributeValues={":until": {"N": str(until)}, ":now": {"N": str(now)}},
    )


CHECK_RUN_SK = "CHECK_RUN"


def check_run_id(table: str, job_id: str) -> int | None:
    """The GitHub check run a job's reports update (created by its first report)."""
    item = (
        client("dynamodb")
        .get_item(TableName=table, Key=key(notice_pk(job_id), CHECK_RUN_SK), ConsistentRead=True)
        .get("Item")
    )
    return int(item["check_run_id"]["N"]) if item else None


def remember_check_run(table: str, job_id: str, run_id: int, ttl: int) -> None:
    client("dynamodb").put_item(
        TableName=table,
        Item=to_attributes({"pk": notice_pk(job_id), "sk": CHECK_RUN_SK, "check_run_id": run_id, "ttl": ttl}),
    )
