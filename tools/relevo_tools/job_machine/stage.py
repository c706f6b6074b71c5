"""One stage of the plan, put together: its approval gate (approval.py), each attempt's dispatch,
claim and run (dispatch.py), the failure of an attempt, its retry by error class, and the stage's
end (failure.py).

`stage_states()` makes every state of one stage; `run_stages()` runs them once per stage of the
plan, in order. A fan-out over a stage's shards (shards.py) wraps `stage_states()` the same way.
"""

from __future__ import annotations

from relevo_tools.job_machine.approval import approval_gate
from relevo_tools.job_machine.asl import State, States
from relevo_tools.job_machine.dispatch import dispatch
from relevo_tools.job_machine.failure import attempt_failure, manual_review, stage_failure
from relevo_tools.job_machine.shards import fan_out


def stage_states(shard: bool = False) -> tuple[str, States]:
    """Every state of one stage, and the one it starts at. The stage's input is one item of
    run_stages' ItemSelector; its output, the agent's answer. A shard's (`shard`): one item of
    the fan-out's (shards.py), without the approval gate (the stage passed it before its fan-out)."""
    states: States = {}
    if shard:
        states |= dispatch(gate="ClosedBeforeDispatch", shard=True)
        states["ClosedBeforeDispatch"] = {
            "Type": "Pass",
            "Comment": "The shard's record was closed before its dispatch: a sibling's failure stopped it, "
            "or a redrive carried it "
            "over as succeeded from the job it resumes (relevo_core.store.carried_shards). Its output says "
            "so, small: the "
            "fan-out keeps every shard's.",
            "Parameters": {"shard.$": "$.stage.shard", "dispatched": False},
            "End": True,
        }
    else:
        states |= dispatch(gate="GatedOrSharded")
        states |= approval_gate("MarkStageDispatched")
        states |= fan_out("NotifyAwaitingApproval", *stage_states(shard=True))
    states |= manual_review("NextAttempt", shard)
    states |= attempt_failure("MarkStageDispatched")
    states |= stage_failure(shard)
    return "MarkStageDispatched", states


def run_stages(next_state: str, on_failure: str) -> State:
    """The stages of the plan, strictly in order, each from stage_states()."""
    start, states = stage_states()
    return {
        "Type": "Map",
        "Comment": "Stages run strictly in plan order. Each iteration's output is what its agent answered "
        "(a resolved manual "
        "review: its claim), kept as $.stage_outcomes for the job's end.",
        "ItemsPath": "$.stages",
        "MaxConcurrency": 1,
        "ItemSelector": {
            "job_id.$": "$.job_id",
            "queue_url.$": "$.queue_url",
            "lease_ttl_sec.$": "$.lease_ttl_sec",
            "queue_timeout_sec.$": "$.queue_timeout_sec",
            "dispatch_wait_sec.$": "$.queue_timeout_sec",
            "region.$": "$.envelope.region_affinity",
            "stage.$": "$$.Map.Item.Value",
            "attempt": 1,
            "backoff_total_sec": 0,
            "project.$": "$.project",
            "signs.$": "$.signs",
            "claim": {"agent_id": ""},
            "idempotency_key.$": "$.envelope.idempotency_key",
            "ttl.$": "$.envelope.ttl",
        },
        "ItemProcessor": {"ProcessorConfig": {"Mode": "INLINE"}, "StartAt": start, "States": states},
        "ResultPath": "$.stage_outcomes",
        "Next": next_state,
        "Catch": [{"ErrorEquals": ["States.ALL"], "ResultPath": "$.error", "Next": on_failure}],
    }
