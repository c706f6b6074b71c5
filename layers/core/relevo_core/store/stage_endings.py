"""Access pattern: the stages of a job that ended while they were still open.

A job canceled (or whose execution was stopped, aborted or timed out outside Relevo) leaves the
stage it was on `dispatched`, `running`, `reconciled` or in `manual_review`: nothing will ever
finish it. Ending the job ends those stages too, each with one conditional write (still open),
so a holder's late report cannot bring one back, and `closed_at` makes the claim protocol
refuse them (relevo_core.store.stage_claims), as it refuses the stage a job failed on (the
state machine's MarkStageFailed). The write also takes
the stage out of the held-by index, so a restarted agent does not find it among its attempts.
Stages never dispatched have no record; the job view shows them `skipped`.
"""

from __future__ import annotations

from datetime import datetime

from botocore.exceptions import ClientError

from relevo_core.aws import client, error_code
from relevo_core.models.status import StageStatus
from relevo_core.store.codec import to_attributes
from relevo_core.store.keys import stages_pk
from relevo_core.store.paging import query_items

_OPEN = (
    StageStatus.PENDING,
    StageStatus.DISPATCHED,
    StageStatus.RUNNING,
    StageStatus.UNKNOWN,
    StageStatus.RECONCILED,
    StageStatus.MANUAL_REVIEW,
)


def end_open_stages(table: str, job_id: str, status: StageStatus, now: datetime, writer: str) -> list[str]:
    """Give every open stage of the job `status` (canceled); returns the stage names it ended."""
    ended = []
    for item in query_items(
        TableName=table,
        KeyConditionExpression="pk = :pk AND begins_with(sk, :stage)",
        ExpressionAttributeValues={":pk": {"S": stages_pk(job_id)}, ":stage": {"S": "STAGE#"}},
        ConsistentRead=True,
    ):
        if item.get("status") not in {s.value for s in _OPEN}:
            continue
        names = [f":open{i}" for i in range(len(_OPEN))]
        try:
            client("dynamodb").update_item(
                TableName=table,
                Key={"pk": {"S": item["pk"]}, "sk": {"S": item["sk"]}},
                UpdateExpression="SET #status = :ended, ended_at = if_not_exists(ended_at, :now), closed_at "
                "= :now, last_writer = :writer REMOVE held_by",
                ConditionExpression=f"#status IN ({', '.join(names)})",
                ExpressionAttributeNames={"#status": "status"},
                ExpressionAttributeValues=to_attributes(
                    {
                        ":ended": status.value,
                        ":now": now.isoformat(),
                        ":writer": writer,
                        **dict(zip(names, (s.value for s in _OPEN), strict=True)),
                    }
                ),
            )
        except ClientError as exc:
            if error_code(exc) != "ConditionalCheckFailedException":
                raise
            continue  # it finished meanwhile: its own ending stands
        ended.append(str(item.get("stage_name", item["sk"])))
    return ended
