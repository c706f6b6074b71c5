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

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

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
    return (
        lambda job: None
        if job["status"] in statuses
        else f"only when the job is {what} (it is {job['status']})"
    )


ACTIONS = (
    Action(
        "approve",
        "Approve",
        Level.OPERATE,
        "POST /jobs/{job_id}/approve",
        _when(("waiting",), "waiting at its gate"),
    ),
    Action(
        "reject",
        "Reject",
        Level.OPERATE,
        "POST /jobs/{job_id}/reject",
        _when(("waiting",), "waiting at its gate"),
    ),
    Action("promote", "Promote", Level.MANAGE, "POST /jobs/{job_id}/promote", _when(("queued",), "queued")),
    Action(
        "cancel",
        "Cancel job",
        Level.MANAGE,
        "POST /jobs/{job_id}/cancel",
        lambda job: f"the job already ended ({job['status']})" if job["status"] in ENDED else None,
    ),
    Action("rerun", "Rerun", Level.MANAGE, "POST /jobs/{job_id}/rerun", _when(ENDED, "ended")),
    Action("delete", "Delete", Level.MANAGE, "DELETE /jobs/{job_id}", _when(ENDED, "ended")),
)
RERUN_FROM = Action(
    "rerun",
    "Rerun from this stage",
    Level.MANAGE,
    "POST /jobs/{job_id}/rerun",
    _when(ENDED, "ended"),
    per_stage=True,
)
# On the job list: a rerun from the stage the job stopped at (stopped_stage).
RERUN_FROM_CURRENT = Action(
    "rerun",
    "Rerun from the current stage",
    Level.MANAGE,
    "POST /jobs/{job_id}/rerun",
    _when(ENDED, "ended"),
    per_stage=True,
)
# On the DLQ page: resume a dead-lettered job; lift the freeze of an idempotency key (manage on
# its project, checked inside the route: relevo_core.recovery.key_freeze).
REDRIVE = Action("redrive", "Redrive", Level.MANAGE, "POST /dlq/{job_id}/redrive", lambda entry: None)
UNFREEZE = Action("unfreeze", "Unfreeze", Level.MANAGE, "POST /dlq/keys/{key}/unfreeze", lambda record: None)
# On a project's Caches page: delete one entry (its next job with that key misses and saves it).
DELETE_CACHE_ENTRY = Action(
    "delete-cache-entry",
    "Delete",
    Level.OPERATE,
    "DELETE /projects/{project_id}/caches/entry",
    lambda entry: None,
)
# On the queue page, beside Promote and Cancel job.
SET_PRIORITY = Action(
    "priority", "Set priority", Level.MANAGE, "POST /jobs/{job_id}/priority", _when(("queued",), "queued")
)
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
    return level_of(caller, [_as_listed(grant) for grant in listed])


def _as_listed(grant: dict[str, Any]) -> Grant:
    """A grant as the API lists it. The stack's admins are listed without project and
    granted_by/at: only principal and level are matched (level_of), so it is not validated."""
    principal, level = grant["principal"], Level(grant["level"])
    made = Grant.model_construct(principal=principal, level=level)  # type: ignore[call-arg]  # see above
    return made


def project_levels(api: RelevoApi, caller: str) -> Callable[[str], Level | None]:
    """The caller's level on a project, probed once per project a page shows."""
    levels: dict[str, Level | None] = {}

    def level_on(project: str) -> Level | None:
        if project not in levels:
            levels[project] = caller_level(api, caller, project)
        return levels[project]

    return level_on


def button_state(action: Action, job: dict[str, Any], caller: str, level: Level | None) -> str | None:
    """Why the button is disabled, or None: the caller's level first (what they cannot change)."""
    if level is None or not level.covers(action.level):
        have = level.value if level else "no grant"
        return f"{caller} has {have} on project {job['project']}; {action.label} needs {action.level.value}"
    return action.applies(job)


def stopped_stage(job: dict[str, Any], plan: list[str]) -> tuple[str | None, str | None]:
    """The stage an ended job stopped at, in the project's plan as a rerun reads it (a rerun is of
    the project's current configuration): the one after its last successful stage, or the first
    when none succeeded. (stage, None), or (None, why there is none)."""
    last = job.get("last_successful_stage")
    if last is None:
        return (plan[0], None) if plan else (None, "the project has no stages")
    if last not in plan:
        return None, f"the project's plan no longer has stage {last}"
    after = plan.index(last) + 1
    if after == len(plan):
        return None, "every stage succeeded: nothing after the last one"
    return plan[after], None


def row_buttons(
    job: dict[str, Any], caller: str, level: Level | None, plan: list[str]
) -> list[dict[str, Any]]:
    """The job list's buttons for one job: each action, and the rerun from its stopped stage."""
    buttons = [
        {"action": a, "why_not": button_state(a, job, caller, level), "from_stage": None}
        for a in ACTIONS
        if a.name != "delete"
    ]
    why_not = button_state(RERUN_FROM_CURRENT, job, caller, level)
    stage, none_because = stopped_stage(job, plan)
    buttons.append({"action": RERUN_FROM_CURRENT, "why_not": why_not or none_because, "from_stage": stage})
    delete = BY_NAME["delete"]
    buttons.append(
        {"action": delete, "why_not": button_state(delete, job, caller, level), "from_stage": None}
    )
    return buttons


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
        return api.set_priority(job_id, body.get("priority"))  # type: ignore[arg-type]  # the API checks it
    raise KeyError(name)
