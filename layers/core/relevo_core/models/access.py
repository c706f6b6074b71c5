"""Who may do what to a project: levels `view < operate < manage` per IAM principal."""

from __future__ import annotations

import re
from datetime import datetime
from enum import Enum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# An IAM user, role, root or STS assumed-role (session) ARN. A trailing `/*` makes it a pattern
# matching, as IAM's `*` does, every ARN that starts with the part before the `*`, e.g. every
# session of a role: arn:aws:sts::123456789012:assumed-role/ReleaseBot/*
PRINCIPAL = r"^arn:aws[a-z-]*:(iam|sts)::\d{12}:(root|[A-Za-z0-9+=,.@_/-]+?(/\*)?)$"
_ROLE = re.compile(r"^arn:(aws[a-z-]*):iam::(\d{12}):role/(?:.*/)?([A-Za-z0-9+=,.@_-]+)$")


class Level(str, Enum):
    VIEW = "view"
    OPERATE = "operate"
    MANAGE = "manage"

    @property
    def rank(self) -> int:
        return _RANK[self]

    def covers(self, required: Level) -> bool:
        return self.rank >= required.rank


_RANK = {Level.VIEW: 1, Level.OPERATE: 2, Level.MANAGE: 3}


def principal_matches(pattern: str, arn: str) -> bool:
    """Does a grant's principal (an ARN, a `…/*` pattern, or a role ARN) name this caller?

    A role ARN (arn:aws:iam::A:role/[path/]Name) names every session of the role, because a caller
    that assumed it is seen as arn:aws:sts::A:assumed-role/Name/<session>, never as the role."""
    if pattern == arn:
        return True
    if pattern.endswith("/*"):
        return arn.startswith(pattern[:-1]) and len(arn) > len(pattern) - 1
    role = _ROLE.match(pattern)
    if role:
        partition, account, name = role.groups()
        return arn.startswith(f"arn:{partition}:sts::{account}:assumed-role/{name}/")
    return False


class Grant(BaseModel):
    """One principal's level on one project, as stored in the registry."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    project: str
    # Not re-validated on read: a creator's grant names whatever ARN API Gateway authenticated.
    principal: str
    level: Level
    granted_by: str
    granted_at: datetime


class GrantRequest(BaseModel):
    """PUT /projects/{id}/grants: set one principal's level; `none` revokes it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    principal: str = Field(pattern=PRINCIPAL, max_length=2048)
    level: Level | Literal["none"]
