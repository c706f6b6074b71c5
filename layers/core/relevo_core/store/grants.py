"""Access pattern: permission grants (one item per project and principal), kept in the project's
partition so that one strongly consistent Query answers "does the project exist, and who may do
what to it", and listed across projects through KindIndex for filtered listings."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from relevo_core.aws import client
from relevo_core.models.access import Grant, Level
from relevo_core.store.codec import to_attributes
from relevo_core.store.keys import GRANT_KIND, GRANT_SK_PREFIX, PROJECT_SK, grant_sk, key, project_pk
from relevo_core.store.kinds import items_of_kind
from relevo_core.store.paging import query_items


@dataclass(frozen=True)
class ProjectAccess:
    exists: bool
    grants: tuple[Grant, ...]


def grant_item(project_id: str, principal: str, level: Level, actor: str, now: datetime) -> dict[str, Any]:
    return {
        "pk": project_pk(project_id),
        "sk": grant_sk(principal),
        "project": project_id,
        "principal": principal,
        "level": level.value,
        "granted_by": actor,
        "granted_at": now.isoformat(),
        "kind": GRANT_KIND,
    }


def put_grant(table: str, project_id: str, principal: str, level: Level, actor: str, now: datetime) -> Grant:
    item = grant_item(project_id, principal, level, actor, now)
    client("dynamodb").put_item(TableName=table, Item=to_attributes(item))
    return Grant.model_validate(item)


def delete_grant(table: str, project_id: str, principal: str) -> None:
    client("dynamodb").delete_item(TableName=table, Key=key(project_pk(project_id), grant_sk(principal)))


def project_access(table: str, project_id: str) -> ProjectAccess:
    """The project item's existence and every grant on it, in one consistent Query."""
    exists, grants = False, []
    for item in query_items(
        TableName=table,
        KeyConditionExpression="pk = :pk",
        ExpressionAttributeValues={":pk": {"S": project_pk(project_id)}},
        # Only what a check needs, not the project's declaration.
        ProjectionExpression="sk, principal, #level, granted_by, granted_at",
        ExpressionAttributeNames={"#level": "level"},
        ConsistentRead=True,
    ):
        if item["sk"] == PROJECT_SK:
            exists = True
        elif item["sk"].startswith(GRANT_SK_PREFIX):
            grants.append(Grant.model_validate({**item, "project": project_id}))
    return ProjectAccess(exists, tuple(grants))


def all_grants(table: str) -> list[Grant]:
    """Every grant of every project (KindIndex: eventually consistent, like any GSI)."""
    return [Grant.model_validate(item) for item in items_of_kind(table, GRANT_KIND)]
