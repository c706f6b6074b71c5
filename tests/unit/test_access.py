"""Principal matching and levels (no AWS)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from relevo_core.models.access import Grant, GrantRequest, Level, principal_matches
from relevo_core.projects.permissions import level_of

BOT = "arn:aws:sts::123456789012:assumed-role/ReleaseBot/deploy-1"


@pytest.mark.parametrize(
    ("pattern", "arn", "matches"),
    [
        ("arn:aws:iam::123456789012:user/alice", "arn:aws:iam::123456789012:user/alice", True),
        ("arn:aws:iam::123456789012:user/alice", "arn:aws:iam::123456789012:user/alice2", False),
        ("arn:aws:sts::123456789012:assumed-role/ReleaseBot/*", BOT, True),
        (
            "arn:aws:sts::123456789012:assumed-role/ReleaseBot/*",
            "arn:aws:sts::123456789012:assumed-role/ReleaseBot/",
            False,
        ),
        (
            "arn:aws:sts::123456789012:assumed-role/ReleaseBot/*",
            "arn:aws:sts::123456789012:assumed-role/ReleaseBotX/s",
            False,
        ),
        (
            "arn:aws:sts::123456789012:assumed-role/ReleaseBot/*",
            "arn:aws:sts::999999999999:assumed-role/ReleaseBot/s",
            False,
        ),
        # A role ARN (with or without a path) names the role's sessions.
        ("arn:aws:iam::123456789012:role/ReleaseBot", BOT, True),
        ("arn:aws:iam::123456789012:role/ci/ReleaseBot", BOT, True),
        ("arn:aws:iam::123456789012:role/Release", BOT, False),
        ("arn:aws:iam::123456789012:user/ReleaseBot", BOT, False),
    ],
)
def test_principal_matching(pattern, arn, matches):
    assert principal_matches(pattern, arn) is matches


def test_the_highest_matching_grant_wins():
    def grant(principal: str, level: str) -> Grant:
        return Grant(
            project="p", principal=principal, level=level, granted_by="x", granted_at="2026-01-01T00:00:00Z"
        )

    grants = [grant("arn:aws:sts::123456789012:assumed-role/ReleaseBot/*", "operate"), grant(BOT, "view")]
    assert level_of(BOT, grants) is Level.OPERATE
    assert level_of("arn:aws:iam::123456789012:user/bob", grants) is None
    assert Level.MANAGE.covers(Level.OPERATE) and not Level.VIEW.covers(Level.OPERATE)


@pytest.mark.parametrize(
    "principal",
    [
        "*",
        "arn:aws:iam::123456789012:user/*bob",
        "arn:aws:iam::12345:user/bob",
        "alice",
        "arn:aws:s3:::bucket",
    ],
)
def test_a_grant_names_an_iam_principal(principal):
    with pytest.raises(ValidationError):
        GrantRequest(principal=principal, level="view")
