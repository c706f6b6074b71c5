"""Project registry logic: validate a declaration, sync its schedules, and store it."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from relevo_core.config import SchedulerSettings
from relevo_core.models.envelope import validation_error
from relevo_core.models.errors import ErrorCode, RelevoError
from relevo_core.models.project import Project
from relevo_core.store.projects import get_project, put_project


def apply_project(
    table: str, project_id: str, body: Any, actor: str, scheduler: SchedulerSettings | None = None
) -> Project:
    """Store the declaration; with `scheduler`, first make EventBridge Scheduler hold exactly its
    schedules. Schedules are synced before the project is stored, so a failed apply leaves the
    stored declaration as it was and repeating the apply finishes the sync."""
    if not isinstance(body, dict):
        raise RelevoError(ErrorCode.VALIDATION_FAILED, "(root): a project is a JSON object")
    if body.get("id", project_id) != project_id:
        raise RelevoError(ErrorCode.VALIDATION_FAILED, f"id: {body.get('id')!r} does not match the path {project_id!r}")
    try:
        project = Project.model_validate({**body, "id": project_id})
    except ValidationError as exc:
        raise validation_error(exc) from exc
    if scheduler is not None:
        from relevo_core.schedules import check_scheduler_names, sync_schedules

        check_scheduler_names(project)
        try:
            previous = get_project(table, project_id).schedules
        except RelevoError as exc:
            if exc.code is not ErrorCode.PROJECT_NOT_FOUND:
                raise
            previous = ()
        sync_schedules(scheduler, project_id, project.schedules, previous)
    put_project(table, project, actor)
    return project
