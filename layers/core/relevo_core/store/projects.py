"""Access pattern: the project registry (one item per project)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from botocore.exceptions import ClientError

from relevo_core.aws import client
from relevo_core.models.access import Level
from relevo_core.models.errors import ErrorCode, RelevoError
from relevo_core.models.project import Project
from relevo_core.store.codec import from_attributes, to_attributes
from relevo_core.store.grants import grant_item
from relevo_core.store.keys import PROJECT_KIND, PROJECT_SK, key, project_pk
from relevo_core.store.kinds import items_of_kind


class ProjectExists(Exception):
    """A creation found the project already registered (someone else created it first)."""


def _project_item(project: Project, actor: str, now: datetime) -> dict[str, Any]:
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
    item = _project_item(project, actor, datetime.now(timezone.utc))
    client("dynamodb").put_item(TableName=table, Item=to_attributes(item))


def create_project(table: str, project: Project, actor: str, now: datetime) -> None:
    """A new project and its creator's `manage` grant, in one transaction: the project is
    created once, and never without someone who may manage it."""
    try:
        client("dynamodb").transact_write_items(
            TransactItems=[
                {
                    "Put": {
                        "TableName": table,
                        "Item": to_attributes(_project_item(project, actor, now)),
                        "ConditionExpression": "attribute_not_exists(pk)",
                    }
                },
                {"Put": {"TableName": table, "Item": to_attributes(grant_item(project.id, actor, Level.MANAGE, actor, now))}},
            ]
        )
    except ClientError as exc:
        codes = [reason.get("Code") for reason in exc.response.get("CancellationReasons") or []]
        if exc.response["Error"]["Code"] == "TransactionCanceledException" and codes[:1] == ["ConditionalCheckFailed"]:
            raise ProjectExists(project.id) from exc
        raise


def list_projects(table: str) -> list[Project]:
    return [Project.model_validate(record["project"]) for record in items_of_kind(table, PROJECT_KIND)]


def get_project(table: str, project_id: str) -> Project:
    response = client("dynamodb").get_item(TableName=table, Key=key(project_pk(project_id), PROJECT_SK))
    if "Item" not in response:
        raise RelevoError(ErrorCode.PROJECT_NOT_FOUND, f"no project {project_id!r} is registered")
    return Project.model_validate(from_attributes(response["Item"])["project"])
