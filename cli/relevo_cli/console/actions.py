"""The actions the job page offers, when each applies, and whether the caller may use it.

The API decides: every action is the API call the CLI makes, and a refusal is the API's own
(403 with its `details`). This module only says which buttons to show enabled. A button the job's
state rules out, or the caller's level does not cover, is disabled with the reason as its tooltip,
never hidden. The level each action needs is the one its route declares in functions/ (a test
reads the handlers and compares); the caller's level is probed from the project's grants
(GET /projects/{id}/grants) and the caller's identity (STS GetCallerIdentity), matched with the
core's own rule (relevo_core.projects.permissions.level_of).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from relevo_cli.api import ApiError, RelevoApi
from relevo_core.models.access import Grant, Level
from relevo_core.projects.permissions import level_of

ENDED = ("succeeded", "failed", "canceled")


@dataclass(frozen=True)
class Action:
    name: str  # the console's route: POST /jobs/{id}/actions/{name}
    label: str  # the button's accessible name
    level: Level
    route: str  # the API route it calls (checked against functions/ by a test)
    applies: Callable[[dict[str, Any]], str | None]  # why the job's state rules it out, or None
    per_stage: bool = False


def _when(statuses: tuple[str, ...], what: str) -> Callable[[dict[str, Any]], str | None]:
    return lambda job: None if job["status"] in statuses else f"only when the job is {what} (it is {job['status']})"


ACTIONS = (
    Action("approve", "Approve", Level.OPERATE, "POST /jobs/{job_id}/approve", _when(("waiting",), "waiting at its gate")),
    Action("reject", "Reject", Level.OPERATE, "POST /jobs/{job_id}/reject", _when(("waiting",), "waiting at its gate")),
    Action("promote", "Promote", Level.MANAGE, "POST /jobs/{job_id}/promote", _when(("queued",), "queued")),
    Action("cancel", "Cancel job", Level.MANAGE, "POST /jobs/{job_id}/cancel",
           lambda job: f"the job already ended ({job['status']})" if job["status"] in ENDED else None),
    Action("rerun", "Rerun", Level.MANAGE, "POST /jobs/{job_id}/rerun", _when(ENDED, "ended")),
    Action("delete", "Delete", Level.MANAGE, "DELETE /jobs/{job_id}", _when(ENDED, "ended")),
)
RERUN_FROM = Action("rerun", "Rerun from this stage", Level.MANAGE, "POST /jobs/{job_id}/rerun", _when(ENDED, "ended"), per_stage=True)
# On the DLQ page: resume a dead-lettered job; lift the freeze of an idempotency key (manage on
# its project, checked inside the route: relevo_core.recovery.key_freeze).
REDRIVE = Action("redrive", "Redrive", Level.MANAGE, "POST /dlq/{job_id}/redrive", lambda entry: None)
UNFREEZE = Action("unfreeze", "Unfreeze", Level.MANAGE, "POST /dlq/keys/{key}/unfreeze", lambda record: None)
# On the queue page, beside Promote and Cancel job.
SET_PRIORITY = Action("priority", "Set priority", Level.MANAGE, "POST /jobs/{job_id}/priority", _when(("queued",), "queued"))
BY_NAME = {action.name: action for action in (*ACTIONS, SET_PRIORITY)}


def caller_arn(api: RelevoApi) -> str:
    """Who the API will see: the ARN STS gives for the credentials the console signs with."""
    return api.session.client("sts").get_caller_identity()["Arn"]


def caller_level(api: RelevoApi, caller: str, project: str) -> Level | None:
    """The caller's level on the project from its grants, as the API computes it (None: no grant)."""
    try:
        listed = api.grants(project)["grants"]
    except ApiError as exc:
        if exc.status == 403:
            return None
        raise
    # The stack's admins are listed without granted_by/at: only principal and level are matched.
    return level_of(caller, [Grant.model_construct(principal=g["principal"], level=Level(g["level"])) for g in listed])


def button_state(action: Action, job: dict[str, Any], caller: str, level: Level | None) -> str | None:
    """Why the button is disabled, or None: the caller's level first (what they cannot change)."""
    if level is None or not level.covers(action.level):
        have = level.value if level else "no grant"
        return f"{caller} has {have} on project {job['project']}; {action.label} needs {action.level.value}"
    return action.applies(job)


def api_call(api: RelevoApi, name: str, job_id: str, body: dict[str, Any]) -> Any:
    """The API call behind an action (the same RelevoApi method the CLI's command uses)."""
    reason = body.get("reason") or None
    if name == "approve":
        return api.approve(job_id, reason)
    if name == "reject":
        return api.reject(job_id, reason or "")
    if name == "promote":
        return api.promote_job(job_id)
    if name == "cancel":
        return api.cancel_job(job_id)
    if name == "rerun":
        return api.rerun_job(job_id, body.get("from_stage") or None)
    if name == "delete":
        return api.delete_job(job_id)
    if name == "priority":
        # The API validates the number (VALIDATION_FAILED); only a JSON integer is passed on.
        return api.set_priority(job_id, body.get("priority"))
    raise KeyError(name)
