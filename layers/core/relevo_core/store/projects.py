"""Access pattern: the project registry (one item per project). A project's creation, which writes
its creator's grant too, is in store.project_creation."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from relevo_core.aws import client
from relevo_core.models.errors import ErrorCode, RelevoError
from relevo_core.store.codec import from_attributes, to_attributes
from relevo_core.store.keys import PROJECT_KIND, PROJECT_SK, key, project_pk
from relevo_core.store.kinds import items_of_kind

if TYPE_CHECKING:
    from relevo_core.models.project import Project


def _model() -> type[Project]:
    # Imported by the first read that makes a Project: get_project_document builds no model.
    from relevo_core.models.project import Project

    return Project


def project_item(project: Project, actor: str, now: datetime) -> dict[str, Any]:
    return {
        "pk": project_pk(project.id),
        "sk": PROJECT_SK,
        "project": project.model_dump(mode="json"),
        "updated_at": now.isoformat(),
        "updated_by": actor,
        # KindIndex lists every project without a scan.
        "kind": PROJECT_KIND,
    }


def put_project(table: str, project: Project, actor: str) -> None:
    item = project_item(project, actor, datetime.now(UTC))
    client("dynamodb").put_item(TableName=table, Item=to_attributes(item))


def list_projects(table: str) -> list[Project]:
    return [_model().model_validate(record["project"]) for record in items_of_kind(table, PROJECT_KIND)]


def get_project_document(table: str, project_id: str) -> dict[str, Any]:
    """A project as stored (put_project's JSON of a validated Project), not yet read into the
    model: for a reader that needs a field before it needs the project. The webhook intake takes
    the secret's name from it to verify a delivery, and builds the model for a verified one only."""
    response = client("dynamodb").get_item(TableName=table, Key=key(project_pk(project_id), PROJECT_SK))
    if "Item" not in response:
        raise RelevoError(ErrorCode.PROJECT_NOT_FOUND, f"no project {project_id!r} is registered")
    return dict(from_attributes(response["Item"])["project"])


def get_project(table: str, project_id: str) -> Project:
    return _model().model_validate(get_project_document(table, project_id))
