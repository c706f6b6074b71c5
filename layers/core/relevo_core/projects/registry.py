"""Project registry logic: validate a declaration, sync its schedules, and store it; who may see
and change it (grants); delete it once none of its jobs is live."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from relevo_core.config import AccessSettings
from relevo_core.config.scheduler import SchedulerSettings
from relevo_core.models.access import GrantRequest, Level
from relevo_core.models.envelope import validation_error
from relevo_core.models.errors import ErrorCode, RelevoError
from relevo_core.models.project import Project
from relevo_core.models.status import JobStatus
from relevo_core.plan_limits import require_project_fits
from relevo_core.projects.permissions import require, visibility
from relevo_core.store import grants
from relevo_core.store.grants import project_access
from relevo_core.store.jobs_by_status import jobs_with_status
from relevo_core.store.project_creation import ProjectExists, create_project
from relevo_core.store.project_removal import delete_project_partition
from relevo_core.store.projects import get_project, list_projects, put_project


def _validate(project_id: str, body: Any) -> Project:
    if not isinstance(body, dict):
        raise RelevoError(ErrorCode.VALIDATION_FAILED, "(root): a project is a JSON object")
    if body.get("id", project_id) != project_id:
        raise RelevoError(
            ErrorCode.VALIDATION_FAILED, f"id: {body.get('id')!r} does not match the path {project_id!r}"
        )
    try:
        project = Project.model_validate({**body, "id": project_id})
    except ValidationError as exc:
        raise validation_error(exc) from exc
    require_project_fits(project)
    return project


def apply_project(
    settings: AccessSettings,
    project_id: str,
    body: Any,
    actor: str,
    scheduler: SchedulerSettings | None = None,
) -> Project:
    """Create a project (any caller IAM lets through; the creator gets `manage`) or change one
    (`manage`). With `scheduler`, EventBridge Scheduler is made to hold exactly its schedules.

    A change syncs schedules before it stores the declaration, so a failed apply leaves the stored
    declaration as it was and repeating it finishes the sync. A creation stores first (that is what
    claims the id, atomically with the creator's grant) and syncs after; repeating a failed one
    is then a change, which finishes the sync."""
    table = settings.table_name
    if project_access(table, project_id).exists:
        return _change(settings, project_id, body, actor, scheduler)
    project = _validate(project_id, body)
    if scheduler is not None:
        from relevo_core.intake.schedules import check_scheduler_names

        check_scheduler_names(project)
    try:
        create_project(table, project, actor, datetime.now(UTC))
    except ProjectExists:
        # Someone created it in between: this is now a change, which needs `manage`.
        return _change(settings, project_id, body, actor, scheduler)
    if scheduler is not None:
        from relevo_core.intake.schedules import sync_schedules

        sync_schedules(scheduler, project_id, project.schedules, ())
    return project


def _change(
    settings: AccessSettings, project_id: str, body: Any, actor: str, scheduler: SchedulerSettings | None
) -> Project:
    require(settings, actor, project_id, Level.MANAGE)
    project = _validate(project_id, body)
    if scheduler is not None:
        from relevo_core.intake.schedules import check_scheduler_names, sync_schedules

        check_scheduler_names(project)
        sync_schedules(
            scheduler, project_id, project.schedules, get_project(settings.table_name, project_id).schedules
        )
    put_project(settings.table_name, project, actor)
    return project


# A job in one of these statuses still needs its project (its plan, lock, grants).
LIVE_STATUSES = tuple(status for status in JobStatus if not status.terminal)


def delete_project(
    settings: AccessSettings, project_id: str, scheduler: SchedulerSettings | None = None
) -> dict[str, Any]:
    """DELETE /projects/{id} (the caller was checked for `manage`): its schedules, grants and
    declaration, refused while a job of it is held, queued or running (409 PROJECT_HAS_LIVE_JOBS:
    cancel it or let it end). Its ended jobs stay, readable by id; a project of the same id can be
    applied again."""
    table = settings.table_name
    project = get_project(table, project_id)
    for status in LIVE_STATUSES:
        live = next(jobs_with_status(table, status.value, project_id), None)
        if live is not None:
            raise RelevoError(
                ErrorCode.PROJECT_HAS_LIVE_JOBS,
                f"project {project_id} has a {status.value} job, {live['job_id']}: cancel it (relevo job "
                "cancel) or let it end, then delete the project",
                job_id=live["job_id"],
                status=status.value,
            )
    if scheduler is not None and project.schedules:
        from relevo_core.intake.schedules import sync_schedules

        sync_schedules(scheduler, project_id, (), project.schedules)
    items = delete_project_partition(table, project_id)
    return {
        "project": project_id,
        "deleted": True,
        "schedules_removed": len(project.schedules),
        "grants_removed": max(0, items - 1),
    }


def show_project(settings: AccessSettings, project_id: str) -> Project:
    """GET /projects/{id} (the caller was checked for `view`): the stored declaration."""
    return get_project(settings.table_name, project_id)


def visible_projects(settings: AccessSettings, caller: str) -> list[Project]:
    """The projects the caller may view (GET /projects)."""
    can = visibility(settings, caller)
    return [project for project in list_projects(settings.table_name) if can.view(project.id)]


def set_grant(settings: AccessSettings, project_id: str, body: Any, actor: str) -> dict[str, Any]:
    """PUT /projects/{id}/grants (the caller was checked for `manage`): `level: none` revokes."""
    try:
        request = GrantRequest.model_validate(body)
    except ValidationError as exc:
        raise validation_error(exc) from exc
    if request.level == "none":
        grants.delete_grant(settings.table_name, project_id, request.principal)
        return {"project": project_id, "principal": request.principal, "level": "none"}
    grant = grants.put_grant(
        settings.table_name,
        project_id,
        request.principal,
        Level(request.level),
        actor,
        datetime.now(UTC),
    )
    return grant.model_dump(mode="json")


def list_grants(settings: AccessSettings, project_id: str) -> list[dict[str, Any]]:
    """GET /projects/{id}/grants (the caller was checked for `view`), plus the stack's admins."""
    listed = [
        grant.model_dump(mode="json") for grant in project_access(settings.table_name, project_id).grants
    ]
    return listed + [
        {"project": project_id, "principal": admin, "level": Level.MANAGE.value, "admin": True}
        for admin in settings.admins
    ]
