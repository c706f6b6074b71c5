"""Access pattern: a project's creation, in one transaction with its creator's `manage` grant (the
project item itself is store.projects', the grant item store.grants')."""

from __future__ import annotations

from datetime import datetime

from botocore.exceptions import ClientError

from relevo_core.aws import client
from relevo_core.models.access import Level
from relevo_core.models.project import Project
from relevo_core.store.codec import to_attributes
from relevo_core.store.conditional import transaction_cancellation
from relevo_core.store.grants import grant_item
from relevo_core.store.projects import project_item


class ProjectExists(Exception):
    """A creation found the project already registered (someone else created it first)."""


def create_project(table: str, project: Project, actor: str, now: datetime) -> None:
    """A new project and its creator's `manage` grant, in one transaction: the project is
    created once, and never without someone who may manage it."""
    try:
        client("dynamodb").transact_write_items(
            TransactItems=[
                {
                    "Put": {
                        "TableName": table,
                        "Item": to_attributes(project_item(project, actor, now)),
                        "ConditionExpression": "attribute_not_exists(pk)",
                    }
                },
                {
                    "Put": {
                        "TableName": table,
                        "Item": to_attributes(grant_item(project.id, actor, Level.MANAGE, actor, now)),
                    }
                },
            ]
        )
    except ClientError as exc:
        cancellation = transaction_cancellation(exc)
        if cancellation is not None and cancellation.condition_failed(0):
            raise ProjectExists(project.id) from exc
        raise
