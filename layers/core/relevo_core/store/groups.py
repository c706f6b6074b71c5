"""Access pattern: project groups and their channels (one item per group, listed by KindIndex)."""

from __future__ import annotations

from datetime import datetime

from relevo_core.aws import client
from relevo_core.models.errors import ErrorCode, RelevoError
from relevo_core.models.group import Group
from relevo_core.store.codec import from_attributes, to_attributes
from relevo_core.store.keys import GROUP_KIND, GROUP_SK, group_pk, key


def put_group(table: str, group: Group, actor: str, now: datetime) -> None:
    item = {
        "pk": group_pk(group.name),
        "sk": GROUP_SK,
        "group": group.model_dump(mode="json"),
        "updated_at": now.isoformat(),
        "updated_by": actor,
        "kind": GROUP_KIND,
    }
    client("dynamodb").put_item(TableName=table, Item=to_attributes(item))


def find_group(table: str, name: str) -> Group | None:
    response = client("dynamodb").get_item(TableName=table, Key=key(group_pk(name), GROUP_SK))
    if "Item" not in response:
        return None
    return Group.model_validate(from_attributes(response["Item"])["group"])


def get_group(table: str, name: str) -> Group:
    group = find_group(table, name)
    if group is None:
        raise RelevoError(
            ErrorCode.GROUP_NOT_FOUND, f"no group {name!r} is defined (relevo group apply FILE)"
        )
    return group
