"""Access pattern: deleting a job's items — its stage records under `JOB#{job}`, its log chunks
under `LOGS#{job}` and each shard's `LOGS#{job}/{stage}/{shard}` (which shards, from the job's plan:
the record stays until last, so a purge run again still finds them), its artifact records under
`ARTIFACTS#{job}` and its task tokens under `TOKENS#{job}` — and, last, its record.

A job may have thousands of log chunks, far beyond one transaction (100 items), so the items go
in BatchWriteItem deletes of 25. Every delete here is safe to repeat (deleting a missing item is
not an error), and the job record goes last and only while it is still in an ended status: an
interrupted purge leaves the job visible and ended, and running the purge again finishes it.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterable
from typing import Any

from botocore.exceptions import ClientError

from relevo_core.aws import client, error_code
from relevo_core.store.keys import JOB_SK, artifact_pk, job_pk, key, log_pk, stages_pk, tokens_pk

# BatchWriteItem takes at most 25 requests.
BATCH_SIZE = 25
_UNPROCESSED_RETRIES = 8


def _keys_of_partition(table: str, pk: str) -> Iterable[tuple[str, str]]:
    """(pk, sk) of every item of the partition, a page at a time (keys only)."""
    kwargs: dict[str, Any] = {
        "TableName": table,
        "KeyConditionExpression": "pk = :pk",
        "ExpressionAttributeValues": {":pk": {"S": pk}},
        "ProjectionExpression": "pk, sk",
        "ConsistentRead": True,
    }
    while True:
        page = client("dynamodb").query(**kwargs)
        yield from ((item["pk"]["S"], item["sk"]["S"]) for item in page["Items"])
        if "LastEvaluatedKey" not in page:
            return
        kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]


def _delete_batch(table: str, keys: list[tuple[str, str]]) -> None:
    requests: list[dict[str, Any]] = [{"DeleteRequest": {"Key": key(pk, sk)}} for pk, sk in keys]
    for attempt in range(_UNPROCESSED_RETRIES):
        response = client("dynamodb").batch_write_item(RequestItems={table: requests})
        requests = response.get("UnprocessedItems", {}).get(table, [])
        if not requests:
            return
        # Throttled: back off (full jitter) and send only what was left.
        time.sleep(random.uniform(0, 0.05 * 2**attempt))
    raise RuntimeError(f"{len(requests)} deletes still unprocessed; deleting the job again finishes them")


def delete_partition(table: str, pk: str, keep_sk: str | None = None) -> int:
    """Delete every item of the partition except `keep_sk`; returns how many were deleted.

    The keys are read page by page and deleted as they are read, so memory stays bounded however
    many chunks a job wrote."""
    deleted = 0
    batch: list[tuple[str, str]] = []
    for item_key in _keys_of_partition(table, pk):
        if item_key[1] == keep_sk:
            continue
        batch.append(item_key)
        if len(batch) == BATCH_SIZE:
            _delete_batch(table, batch)
            deleted += len(batch)
            batch = []
    if batch:
        _delete_batch(table, batch)
        deleted += len(batch)
    return deleted


def delete_job_children(
    table: str, job_id: str, log_parts: Iterable[tuple[int, int] | None] = (None,)
) -> dict[str, int]:
    """Delete the job's stage records, then its log chunks and artifact records; the job record
    stays. The stage records go first: log and artifact writes are fenced on the stage record
    (a ConditionCheck on the attempt's holder), so once it is gone no writer can add a chunk or
    an artifact record behind the purge. `log_parts`: the job's log partitions
    (store/log_chunks.job_log_parts of its envelope)."""
    return {
        # Stage records under the job's own partition too: a stack deployed before they had one.
        "stages": delete_partition(table, stages_pk(job_id))
        + delete_partition(table, job_pk(job_id), keep_sk=JOB_SK),
        "log_chunks": sum(
            delete_partition(table, log_pk(job_id) if part is None else log_pk(job_id, *part))
            for part in log_parts
        ),
        "artifacts": delete_partition(table, artifact_pk(job_id)),
        # Tokens of tasks that no longer wait: the job has ended.
        "task_tokens": delete_partition(table, tokens_pk(job_id)),
    }


def delete_job_record(table: str, job_id: str, ended_statuses: Iterable[str]) -> bool:
    """Delete the job record while it is in one of `ended_statuses`. False when it was already
    gone (a concurrent delete finished first) or is no longer ended (never happens: an ended job
    does not move on)."""
    statuses = sorted(ended_statuses)
    placeholders = {f":s{index}": {"S": status} for index, status in enumerate(statuses)}
    try:
        client("dynamodb").delete_item(
            TableName=table,
            Key=key(job_pk(job_id), JOB_SK),
            ConditionExpression=f"#status IN ({', '.join(placeholders)})",
            ExpressionAttributeNames={"#status": "status"},
            ExpressionAttributeValues=placeholders,
        )
    except ClientError as exc:
        if error_code(exc) == "ConditionalCheckFailedException":
            return False
        raise
    return True
