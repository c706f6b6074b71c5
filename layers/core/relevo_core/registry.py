"""Project registry logic: validate a declaration and store it."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from relevo_core.models.envelope import validation_error
from relevo_core.models.errors import ErrorCode, RelevoError
from relevo_core.models.project import Project
from relevo_core.store.projects import put_project


def apply_project(table: str, project_id: str, body: Any, actor: str) -> Project:
    if not isinstance(body, dict):
        raise RelevoError(ErrorCode.VALIDATION_FAILED, "(root): a project is a JSON object")
    if body.get("id", project_id) != project_id:
        raise RelevoError(ErrorCode.VALIDATION_FAILED, f"id: {body.get('id')!r} does not match the path {project_id!r}")
    try:
        project = Project.model_validate({**body, "id": project_id})
    except ValidationError as exc:
        raise validation_error(exc) from exc
    put_project(table, project, actor)
    return project
