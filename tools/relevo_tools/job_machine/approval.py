"""The plan's approval gate: the job waits for a person at the gated stage (whose first dispatch
was refused: dispatch.py, GATE_CONDITION), says so on its record and on the project's lock, and
goes on to the stage's dispatch once approved; a rejection or a timeout fails the stage."""

from __future__ import annotations

from relevo_core.models.errors import ErrorClass
from relevo_core.models.status import JobStatus, StageStatus
from relevo_core.store import keys
from relevo_tools.job_machine.asl import (
    NOW,
    STATUS,
    WRITER,
    State,
    States,
    job_key,
    lock_key,
    number_at,
    stage_key,
    string_at,
    token_item,
    transaction,
    update,
)
from relevo_tools.job_machine.failure import failed_with
from relevo_tools.job_machine.lock_writes import GATE


def _notify(event: str, next_state: str) -> State:
    return {
        "Type": "Task",
        "Resource": "arn:aws:states:::sns:publish",
        "Parameters": {
            "TopicArn": "${NotificationTopicArn}",
            "Subject": f"Relevo {event}",
            "Message": {
                "event": event,
                "job_id.$": "$.job_id",
                "project.$": "$.project",
                "stage.$": "$.stage.name",
            },
        },
        "ResultPath": None,
        "Next": next_state,
    }


def approval_gate(approved: str) -> States:
    """The plan's approval gate, where the gated stage's first dispatch was refused: the job
    waits for POST /jobs/{id}/approve or /reject, then the stage goes on to `approved`; a
    rejection or a timeout fails the stage."""
    return {
        "NotifyAwaitingApproval": _notify("job.waiting_for_approval", "AwaitApproval"),
        **transaction(
            "AwaitApproval",
            [
                {
                    "Update": update(
                        job_key(),
                        "SET #status = :waiting, waiting_stage = :stage, last_writer = :writer, updated_at "
                        "= :now",
                        names=STATUS,
                        values={
                            ":waiting": {"S": JobStatus.WAITING.value},
                            ":stage": string_at("$.stage.name"),
                            ":writer": WRITER,
                            ":now": NOW,
                        },
                    )
                },
                {"Put": token_item(keys.APPROVAL_TOKEN_SK, {"stage": string_at("$.stage.name")})},
                # The project's lock says its holder waits for a person: the jobs queued behind it
                # park without spending their queue timeout (lock_line.py, WaitBehindGate), and say why.
                {
                    "Update": update(
                        lock_key(),
                        f"SET {GATE} = :gate ADD wake_seq :one",
                        values={
                            ":gate": {
                                "M": {
                                    "job_id": string_at("$.job_id"),
                                    "stage": string_at("$.stage.name"),
                                    "since": NOW,
                                }
                            },
                            ":one": {"N": "1"},
                        },
                    )
                },
            ],
            comment="The job waits; POST /jobs/{id}/approve or /reject answers the token, which is kept in "
            "the job's token "
            'partition (TOKENS#, readable by no job session: docs/architecture.md, "Trust boundaries"), not '
            "on the job record "
            "that the job's agents read. The project's lock it holds says so (`gate`), and its wake_seq "
            "moves so a waiter about "
            "to park reads it first. No item has a condition, so a cancelled transaction is a conflict (or "
            "a throttle) "
            "and is retried with a new token; the approve route only ever fails this task with "
            "Relevo.Approval.Rejected.",
            waits_for_token=True,
            timeout_path="$.stage.approval_timeout_sec",
            answer_path="$.approval",
            before_catch=[
                {"ErrorEquals": ["States.Timeout"], "ResultPath": None, "Next": "ApprovalTimedOut"},
                {
                    "ErrorEquals": [ErrorClass.APPROVAL_REJECTED.value],
                    "ResultPath": "$.failure",
                    "Next": "NotifyRejected",
                },
            ],
            next_state="MarkApproved",
        ),
        **transaction(
            "MarkApproved",
            [
                {
                    "Update": update(
                        job_key(),
                        "SET #status = :running, last_writer = :writer, updated_at = :now REMOVE "
                        "waiting_stage",
                        names=STATUS,
                        values={":running": {"S": JobStatus.RUNNING.value}, ":writer": WRITER, ":now": NOW},
                    )
                },
                # The stage's record, pending until its dispatch, says it was approved: its dispatch's gate
                # condition.
                {
                    "Update": update(
                        stage_key(),
                        "SET approved_at = :now, #status = if_not_exists(#status, :pending), stage_name = "
                        ":name, stage_index = :index, "
                        "last_writer = :writer, #ttl = :ttl",
                        names={**STATUS, "#ttl": "ttl"},
                        values={
                            ":now": NOW,
                            ":pending": {"S": StageStatus.PENDING.value},
                            ":name": string_at("$.stage.name"),
                            ":index": number_at("$.stage.index"),
                            ":writer": WRITER,
                            ":ttl": number_at("$.ttl"),
                        },
                    )
                },
                # Its project runs again: the jobs behind it count their queue timeout again.
                {
                    "Update": update(
                        lock_key(), f"REMOVE {GATE} ADD wake_seq :one", values={":one": {"N": "1"}}
                    )
                },
            ],
            comment="Approved: the job runs again, and the gated stage's record says so (approved_at), "
            "which lets its dispatch "
            "through; the project's lock no longer says its holder waits at a gate. No update has a "
            "condition, so a "
            "cancellation is a conflict (or a throttle) and is retried.",
            next_state=approved,
        ),
        "ApprovalTimedOut": failed_with(
            ErrorClass.APPROVAL_TIMEOUT.value, "approval_timeout", "NotifyApprovalTimedOut"
        ),
        "NotifyApprovalTimedOut": _notify("job.approval_timeout", "AssembleFailureDetail"),
        "NotifyRejected": _notify("job.rejected", "AssembleFailureDetail"),
    }
