"""Access pattern: a project's build numbers (RELEVO_BUILD_NUMBER). One counter item per project
(BUILDNUMBERS#<project>, `last_number`: the last number given) and the number on the job record
(`build_number`), written in one transaction: the counter moves exactly when a job takes a number,
so the numbers of a project are given in order, once each, with no gap.

Why a transaction and a condition on each side (DynamoDB Developer Guide, "Condition expressions"
and "Atomic counters": an unconditional ADD is not idempotent, a call retried after a lost answer
counts twice; DynamoDB API Reference, "TransactWriteItems": all of its actions or none):
  - the job record's `attribute_not_exists(build_number)`: a job takes one number, whoever asks
    for it (two shards of one stage claimed at once, a claim sent again after a lost answer);
  - the counter's `last_number = :seen` (or its absence, for a project's first): two jobs that read
    the same last number cannot both take the next. ADD moves it by the step from what was seen
    (one, or up to the floor).
A refused condition cancels the whole transaction, with one CancellationReason per action in
request order and, with ReturnValuesOnConditionCheckFailure ALL_OLD, the item as it stands
(DynamoDB API Reference, "CancellationReason"): the job's number when it had one, or the counter's
new last number, tried again at once, with no read of its own. A `TransactionConflict` (another
transaction on one of the items at the same instant: Developer Guide, "Transaction conflict
handling in DynamoDB") is tried again after a jittered backoff.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

from botocore.exceptions import ClientError

from relevo_core.aws import client, error_code
from relevo_core.models.errors import ErrorCode, RelevoError
from relevo_core.store.codec import from_attributes
from relevo_core.store.conditional import transaction_cancellation
from relevo_core.store.keys import (
    BUILD_NUMBER_ATTRIBUTE,
    BUILD_NUMBER_SK,
    JOB_SK,
    build_numbers_pk,
    job_pk,
    key,
)

LAST_NUMBER = "last_number"
# Each round that loses to another job's allocation learns the counter from its refusal, so N jobs
# allocating at the same instant need at most N rounds between them; conflicts back off.
MAX_ROUNDS = 64
_BACKOFF_SEC = 0.02
_JOB, _COUNTER = 0, 1


def last_number(table: str, project_id: str) -> int | None:
    """The last build number the project gave; None before its first."""
    response = client("dynamodb").get_item(
        TableName=table,
        Key=key(build_numbers_pk(project_id), BUILD_NUMBER_SK),
        ConsistentRead=True,
        ProjectionExpression=LAST_NUMBER,
    )
    value = from_attributes(response.get("Item") or {}).get(LAST_NUMBER)
    return None if value is None else int(value)


def job_build_number(table: str, job_id: str) -> int | None:
    """The build number on a job's record; None when it has none (or there is no such job)."""
    response = client("dynamodb").get_item(
        TableName=table,
        Key=key(job_pk(job_id), JOB_SK),
        ConsistentRead=True,
        ProjectionExpression=BUILD_NUMBER_ATTRIBUTE,
    )
    value = from_attributes(response.get("Item") or {}).get(BUILD_NUMBER_ATTRIBUTE)
    return None if value is None else int(value)


def _job_update(table: str, job_id: str, number: int) -> dict[str, Any]:
    return {
        "Update": {
            "TableName": table,
            "Key": key(job_pk(job_id), JOB_SK),
            "UpdateExpression": "SET #number = :number",
            "ConditionExpression": "attribute_exists(pk) AND attribute_not_exists(#number)",
            "ExpressionAttributeNames": {"#number": BUILD_NUMBER_ATTRIBUTE},
            "ExpressionAttributeValues": {":number": {"N": str(number)}},
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }
    }


def _counter_update(table: str, project_id: str, seen: int | None, number: int) -> dict[str, Any]:
    values = {":step": {"N": str(number - (seen or 0))}}
    if seen is not None:
        values[":seen"] = {"N": str(seen)}
    return {
        "Update": {
            "TableName": table,
            "Key": key(build_numbers_pk(project_id), BUILD_NUMBER_SK),
            "UpdateExpression": "ADD #last :step",
            "ConditionExpression": "attribute_not_exists(#last)" if seen is None else "#last = :seen",
            "ExpressionAttributeNames": {"#last": LAST_NUMBER},
            "ExpressionAttributeValues": values,
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }
    }


def _refused_job(table: str, job_id: str, item: dict[str, Any]) -> int:
    """The job's own number, from the record that refused the write (ALL_OLD)."""
    if not item:
        raise RelevoError(ErrorCode.JOB_NOT_FOUND, f"no job {job_id!r} to give a build number to")
    return int(item[BUILD_NUMBER_ATTRIBUTE])


def allocate(
    table: str,
    project_id: str,
    job_id: str,
    floor: int = 1,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """The job's build number: the one on its record, or the project's next (at least `floor`),
    taken in one transaction with the counter. Two calls for the project's next number when no
    other job takes one at the same instant (the counter read, the transaction)."""
    seen = last_number(table, project_id)
    for round_ in range(MAX_ROUNDS):
        number = max((seen or 0) + 1, floor)
        try:
            client("dynamodb").transact_write_items(
                TransactItems=[
                    _job_update(table, job_id, number),
                    _counter_update(table, project_id, seen, number),
                ]
            )
            return number
        except ClientError as exc:
            cancellation = transaction_cancellation(exc)
            if cancellation is None:
                raise
        if cancellation.condition_failed(_JOB):
            return _refused_job(table, job_id, cancellation.item(_JOB))
        if cancellation.condition_failed(_COUNTER):
            # Another job took the next number: the counter as it stands now, tried at once.
            current = cancellation.item(_COUNTER).get(LAST_NUMBER)
            seen = None if current is None else int(current)
            continue
        if "TransactionConflict" in cancellation.codes:
            sleep(random.uniform(0, _BACKOFF_SEC * 2 ** min(round_, 6)))
            continue
        raise RuntimeError(f"build number transaction cancelled: {cancellation.codes}")
    raise RuntimeError(f"no build number for {job_id} after {MAX_ROUNDS} rounds")


def carry_over(table: str, job_id: str, number: int) -> int:
    """A rerun or redrive takes the number of the job it retries, the counter unmoved: one
    conditional UpdateItem (a single item needs no transaction); the record's own number when it
    has one already (ReturnValuesOnConditionCheckFailure puts it in the refusal)."""
    update = _job_update(table, job_id, number)["Update"]
    try:
        client("dynamodb").update_item(**update)
    except ClientError as exc:
        if error_code(exc) != "ConditionalCheckFailedException":
            raise
        return _refused_job(table, job_id, from_attributes(exc.response.get("Item", {})))  # type: ignore[arg-type]  # stubs lack Item
    return number
