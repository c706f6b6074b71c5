"""A stage attempt's session (relevo_core.fleet.job_credentials): its tags, name and duration stay
within what STS accepts at the longest names the stack allows, so no claim is ever refused its
credentials by AssumeRole ("Passing session tags in AWS STS", IAM User Guide: at most 50 tags,
keys up to 128 and values up to 256 characters of [\\p{L}\\p{Z}\\p{N}_.:/=+\\-@]; AssumeRole, STS
API Reference: RoleSessionName [\\w+=,.@-]{2,64}, DurationSeconds from 900 to the role's maximum,
one hour when a role's session takes it). The emulator enforces the same (relevo_local.moto.sts)."""

from __future__ import annotations

import re
from datetime import UTC, datetime

from relevo_core.fleet.job_credentials import (
    LINEAGE_TAGS,
    MAX_SESSION_SEC,
    MIN_SESSION_SEC,
    NO_GRANT,
    session_name,
    session_seconds,
    session_tags,
)
from relevo_core.models.checkout_plan import CheckoutPlan
from relevo_core.models.envelope import new_job_id
from relevo_core.models.plan import SigningPlan
from relevo_core.models.project import Project
from relevo_core.plan_limits import largest_envelope

TAG_TEXT = re.compile(r"^[\w\s.:/=+\-@]*$")
LONGEST = {"id": "p" * 63, "repo": "acme/app", "region_affinity": "r" * 32, "lease_ttl_sec": 3600}


def _envelope():
    return largest_envelope(
        Project.model_validate(
            {**LONGEST, "stages": [{"name": "build", "run": "make", "exec_timeout_sec": 86_400}]}
        )
    )


def test_the_tags_of_the_longest_names_and_a_full_lineage_fit_sts():
    ref = "relevo/relevo/_signing/" + "r" * 32 + "/" + "p" * 63 + "/dist.p12"
    envelope = _envelope().model_copy(
        update={
            "signing": SigningPlan(
                keychain="temporary", identities=[{"p12_ref": ref, "passphrase_ref": ref + ".pass"}]
            ),
            "checkout": CheckoutPlan(
                url="https://git.example.com/app.git",
                credentials_ref="relevo/relevo/_git/" + "p" * 63 + "/token",
            ),
        }
    )
    lineage = [new_job_id(datetime(2026, 1, day, tzinfo=UTC).timestamp()) for day in range(1, 9)]
    tags = session_tags(envelope, lineage)
    assert len(tags) <= 50 and len(tags) == 9 + len(LINEAGE_TAGS)
    for key, value in tags.items():
        assert 1 <= len(key) <= 128 and TAG_TEXT.match(key), key
        assert len(value) <= 256 and TAG_TEXT.match(value) and "*" not in value and "?" not in value, (
            key,
            value,
        )
    assert tags["signing"] == f"{'r' * 32}/{'p' * 63}" and tags["git"] == "p" * 63
    assert [tags[name] for name in LINEAGE_TAGS] == lineage


def test_a_tag_that_grants_nothing_names_no_job_project_or_region():
    tags = session_tags(_envelope(), [])
    assert (tags["signing"], tags["git"], tags["release"]) == (NO_GRANT, NO_GRANT, NO_GRANT)
    assert {tags[name] for name in LINEAGE_TAGS} == {NO_GRANT}
    assert not re.match(r"^[a-z0-9]", NO_GRANT)  # no project or region id starts so (models/envelope.py)


def test_only_the_session_of_a_stage_with_an_effect_may_read_its_projects_release_keys():
    # Given a job whose first stage builds (a command) and whose second puts what it handed on
    project = Project.model_validate(
        {
            **LONGEST,
            "stages": [
                {"name": "build", "run": "make", "handoff": ["App.zip"]},
                {
                    "name": "publish",
                    "effect": {
                        "kind": "s3_object",
                        "file": "App.zip",
                        "bucket": "downloads",
                        "key": "App.zip",
                    },
                },
            ],
        }
    )
    envelope = largest_envelope(project)

    # When the sessions of each stage's attempt are tagged
    build, publish = session_tags(envelope, [], 0), session_tags(envelope, [], 1)

    # Then the effect's session names the project's release keys, and the command's names none
    assert publish["release"] == envelope.project
    assert build["release"] == NO_GRANT


def test_a_lineage_longer_than_the_tags_is_refused_rather_than_cut():
    import pytest

    with pytest.raises(ValueError, match="at most 8"):
        session_tags(_envelope(), ["job_" + "a" * 26] * 9)


def test_the_session_name_fits_at_the_longest_job_id_stage_and_attempt():
    name = session_name("job_" + "z" * 40, 99, 1000)
    assert re.match(r"^[\w+=,.@-]{2,64}$", name), name


def test_a_shards_session_names_its_shard_and_fits_at_the_largest_shard_index():
    """RoleSessionName: 2 to 64 of letters, digits and _=,.@- (AssumeRole, STS API Reference)."""
    from relevo_core.models.plan import MAX_DECLARED_SHARDS

    assert session_name("job_" + "a" * 26, 1, 2, shard=3) == "job_" + "a" * 26 + ".1.shard-3.2"
    assert (
        session_name("job_" + "a" * 26, 1, 2, shard=3)
        != session_name("job_" + "a" * 26, 1, 2, shard=4)
        != session_name("job_" + "a" * 26, 1, 2)
    )
    longest = session_name("job_" + "z" * 40, 99, 1000, shard=MAX_DECLARED_SHARDS - 1)
    assert re.match(r"^[\w+=,.@-]{2,64}$", longest) and len(longest) == 62, longest


def test_the_session_lasts_past_the_stages_own_deadlines_within_stss_bounds():
    long_stage = _envelope()  # exec_timeout_sec 86,400: renewed, an hour at a time
    assert session_seconds(long_stage, 0) == MAX_SESSION_SEC == 3600
    short = Project.model_validate(
        {**LONGEST, "lease_ttl_sec": 30, "stages": [{"name": "build", "run": "make", "exec_timeout_sec": 60}]}
    )
    assert session_seconds(largest_envelope(short), 0) == MIN_SESSION_SEC == 900
    middle = Project.model_validate(
        {
            **LONGEST,
            "lease_ttl_sec": 60,
            "stages": [{"name": "build", "run": "make", "exec_timeout_sec": 1200, "kill_grace_sec": 20}],
        }
    )
    assert session_seconds(largest_envelope(middle), 0) == 1200 + 20 + 60 + 300
