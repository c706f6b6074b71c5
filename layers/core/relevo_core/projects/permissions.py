"""The one permission check of every IAM route: levels `view < operate < manage` per project per
IAM principal, from the grants in the registry plus the stack's admin principals. Routes declare it
with the `requires(Level.X)` middleware.

Existence is never revealed to a caller without `view`: such a caller gets the same 403
`FORBIDDEN` body whether the project, job or dead-letter entry exists or not. Only a caller who
may view the target (an admin, for a target that does not exist) learns that it is missing (404).
Grants are read on every request (one strongly consistent Query), so a revoke applies at once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.api_gateway import BaseRouter

from relevo_core.config import AccessSettings, access_settings
from relevo_core.http import caller_arn
from relevo_core.models.access import Grant, Level, principal_matches
from relevo_core.models.errors import ErrorCode, RelevoError
from relevo_core.store import grants as grant_store
from relevo_core.store.jobs import job_project


def is_admin(settings: AccessSettings, caller: str) -> bool:
    return any(principal_matches(admin, caller) for admin in settings.admins)


def level_of(caller: str, grants: tuple[Grant, ...] | list[Grant]) -> Level | None:
    """The highest level any of these grants gives the caller (exact, pattern or role grants)."""
    levels = [grant.level for grant in grants if principal_matches(grant.principal, caller)]
    return max(levels, key=lambda level: level.rank, default=None)


def _hidden(caller: str, kind: str, target: str) -> RelevoError:
    # The same body whether or not the target exists.
    return RelevoError(ErrorCode.FORBIDDEN, f"{caller} has no view permission on {kind} {target}")


def require(
    settings: AccessSettings,
    caller: str,
    project_id: str,
    level: Level,
    target: tuple[str, str] | None = None,
    missing: RelevoError | None = None,
) -> Level:
    """Raise FORBIDDEN unless the caller holds `level` on the project; returns the caller's level.
    `target` is what the caller named (kind, id) when that was not the project itself."""
    kind, name = target or ("project", project_id)
    access = grant_store.project_access(settings.table_name, project_id)
    have = Level.MANAGE if is_admin(settings, caller) else level_of(caller, access.grants)
    if have is None:
        raise _hidden(caller, kind, name)
    if not access.exists:
        raise missing or RelevoError(ErrorCode.PROJECT_NOT_FOUND, f"no project {project_id!r} is registered")
    if not have.covers(level):
        raise RelevoError(
            ErrorCode.FORBIDDEN,
            f"{caller} has {have.value} on project {project_id}; this needs {level.value}",
            required=level.value,
            level=have.value,
        )
    return have


def require_on_job(
    settings: AccessSettings,
    caller: str,
    job_id: str,
    level: Level,
    missing: ErrorCode = ErrorCode.JOB_NOT_FOUND,
) -> str:
    """The same check on the project of a job; returns that project. `missing` is the code an
    admin gets when the job does not exist (JOB_NOT_FOUND, or DLQ_ENTRY_NOT_FOUND for /dlq)."""
    kind = "dead-letter entry" if missing is ErrorCode.DLQ_ENTRY_NOT_FOUND else "job"
    not_found = RelevoError(missing, f"no {kind} {job_id!r}")
    # A dead-letter entry names its project itself: it outlives its job, which may be deleted.
    dead_letter = missing is ErrorCode.DLQ_ENTRY_NOT_FOUND
    project_id = (dead_letter and job_project(settings.table_name, job_id, dead_letter=True)) or job_project(
        settings.table_name, job_id
    )
    if project_id is None:
        if is_admin(settings, caller):
            raise not_found
        raise _hidden(caller, kind, job_id)
    require(settings, caller, project_id, level, target=(kind, job_id), missing=not_found)
    return project_id


def requires(level: Level, missing: ErrorCode = ErrorCode.JOB_NOT_FOUND) -> Callable[..., Response]:
    """Route middleware: the caller must hold `level` on the project the route names
    ({project_id}) or on the project of the job it names ({job_id}); otherwise 403 FORBIDDEN
    and the route never runs. `missing` is what an admin gets for a job that does not exist."""

    def check_permission(app: BaseRouter, next_middleware: Callable[..., Response]) -> Response:
        parameters = app.current_event.get("pathParameters") or {}
        caller = caller_arn(app)
        if "project_id" in parameters:
            require(access_settings(), caller, parameters["project_id"], level)
        else:
            require_on_job(access_settings(), caller, parameters["job_id"], level, missing)
        return next_middleware(app)

    return check_permission


@dataclass(frozen=True)
class Visibility:
    """Which projects a caller may view, for filtering listings."""

    admin: bool
    levels: dict[str, Level]

    def view(self, project_id: str) -> bool:
        return self.admin or project_id in self.levels


def visibility(settings: AccessSettings, caller: str) -> Visibility:
    if is_admin(settings, caller):
        return Visibility(True, {})
    levels: dict[str, Level] = {}
    for grant in grant_store.all_grants(settings.table_name):
        if principal_matches(grant.principal, caller):
            current = levels.get(grant.project)
            if current is None or grant.level.rank > current.rank:
                levels[grant.project] = grant.level
    return Visibility(False, levels)
