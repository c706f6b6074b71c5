"""What a job's execution cost, counted from its Step Functions history the way bench/cost.py
counts it, at us-east-1 list prices (the console's job summary, `GET /jobs/{job_id}/cost`).

Standard workflows are billed per state transition, each `…StateEntered` event of the history
("Step Functions pricing": a state transition each time a step of the workflow runs). The
history's `TaskScheduled` events name the service each task called (`resourceType`: lambda,
dynamodb, sqs, …) and what it did (`resource`: updateItem, sendMessage.waitForTaskToken, …).
What the history cannot show is left out and said so in `basis`: the agent's and the webhook's
own requests, item sizes (a DynamoDB call is taken as one request unit) and Lambda duration.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from botocore.exceptions import ClientError
from pydantic import BaseModel, ConfigDict, Field

from relevo_core.aws import error_code
from relevo_core.execution import execution_history
from relevo_core.models.errors import ErrorCode, RelevoError

# us-east-1 list prices (bench/cost.py prices a whole job with the same numbers).
SFN_PER_TRANSITION = 25 / 1e6
DDB_PER_WRU = 0.625 / 1e6
DDB_PER_RRU = 0.125 / 1e6
SQS_PER_REQUEST = 0.40 / 1e6
LAMBDA_PER_REQUEST = 0.20 / 1e6
LAMBDA_PER_GB_S = 0.0000133334  # arm64

_DYNAMODB_READS = frozenset({"getItem", "query", "scan", "batchGetItem", "transactGetItems"})
BASIS = (
    "the execution's share at us-east-1 list prices: state transitions, and the requests its tasks made "
    "(a DynamoDB call as one request unit); not the agent's or the webhook's requests, nor Lambda duration"
)


class ExecutionCost(BaseModel):
    """The counts of one execution's history and what they cost."""

    model_config = ConfigDict(frozen=True)

    transitions: int = Field(description="states entered: what a Standard workflow is billed for")
    lambda_invocations: int
    dynamodb_reads: int
    dynamodb_writes: int
    sqs_requests: int
    other_requests: dict[str, int] = Field(
        default_factory=dict, description="calls of other services, by service (not priced)"
    )
    dollars: float
    basis: str = BASIS


def count_history(events: Iterable[dict[str, Any]]) -> ExecutionCost:
    transitions = 0
    calls: Counter[str] = Counter()
    reads = writes = 0
    for event in events:
        kind = event["type"]
        if kind.endswith("StateEntered"):
            transitions += 1
        elif kind == "LambdaFunctionScheduled":
            calls["lambda"] += 1
        elif kind == "TaskScheduled":
            details = event.get("taskScheduledEventDetails", {})
            service = details.get("resourceType", "?")
            calls[service] += 1
            if service == "dynamodb":
                # "updateItem", "getItem", … (an integration pattern may follow a dot)
                if details.get("resource", "").split(".")[0] in _DYNAMODB_READS:
                    reads += 1
                else:
                    writes += 1
    dollars = (
        transitions * SFN_PER_TRANSITION
        + calls["lambda"] * LAMBDA_PER_REQUEST
        + reads * DDB_PER_RRU
        + writes * DDB_PER_WRU
        + calls["sqs"] * SQS_PER_REQUEST
    )
    return ExecutionCost(
        transitions=transitions,
        lambda_invocations=calls["lambda"],
        dynamodb_reads=reads,
        dynamodb_writes=writes,
        sqs_requests=calls["sqs"],
        other_requests={k: v for k, v in sorted(calls.items()) if k not in ("lambda", "dynamodb", "sqs")},
        dollars=round(dollars, 8),
    )


def job_cost(machines: Sequence[str], job_id: str) -> dict[str, Any]:
    """GET /jobs/{job_id}/cost: the cost of the job's execution (named after the job, on whichever
    of `machines` runs it) so far."""
    try:
        cost = count_history(execution_history(machines, job_id))
    except ClientError as exc:
        # A held job (never started) has no execution: GetExecutionHistory answers
        # ExecutionDoesNotExist ("GetExecutionHistory", Errors).
        if error_code(exc) != "ExecutionDoesNotExist":
            raise
        raise RelevoError(ErrorCode.JOB_NOT_STARTED, f"job {job_id} has no execution yet") from exc
    return {"job_id": job_id, **cost.model_dump()}
