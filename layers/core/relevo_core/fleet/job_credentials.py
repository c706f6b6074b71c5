"""A stage attempt's credentials: a session of the stack's JobRole whose tags name the job, so
that the role's one policy (template.yaml JobPolicy, written with `${aws:PrincipalTag/...}`)
reaches that job only ("Passing session tags in AWS STS" and "IAM policy elements: Variables and
tags", IAM User Guide).

Why tags and not a session policy per job: AWS caps an inline session policy at 2,048 characters
of plaintext (AssumeRole, STS API Reference), and a rerun's lineage (a prefix and two partitions
per earlier job) took a typical policy past it. Tags stay small and fixed in number: 17 here,
where STS allows 50 (keys up to 128 characters, values up to 256).

A session is minted per attempt, so one tag can name what only that attempt writes: `log`, its
log partition (relevo_core.store.keys.log_partition), the job's own for a stage without shards
and its shard's own for a shard, so that no shard's session writes a sibling's log or the job's.

Every tag is always set: one that grants nothing is "-", which names no job, project or region
(none can be "-"), so a statement never rests on how AWS treats a variable without a value.
"""

from __future__ import annotations

from relevo_core.aws import client
from relevo_core.models.agent_session import JobSession
from relevo_core.models.cache import cache_scope
from relevo_core.models.envelope import JobEnvelope
from relevo_core.store.keys import log_partition

# What a job of a rerun's lineage may be read for: as many as the agent follows (handoff_sources).
LINEAGE_TAGS = tuple(f"l{n}" for n in range(1, 9))
NO_GRANT = "-"
# STS's bounds of DurationSeconds: at least 15 minutes; one hour at most for a session taken by
# another role's session (role chaining), which the claim function's own is ("Role chaining",
# IAM User Guide).
MIN_SESSION_SEC = 900
MAX_SESSION_SEC = 3600
# Past the stage's own deadlines: the handoff and the report after its command, and clock skew.
SESSION_MARGIN_SEC = 300


def session_tags(
    envelope: JobEnvelope, lineage: list[str], stage_index: int = 0, shard: int | None = None
) -> dict[str, str]:
    """The tags of a session for `envelope`'s job, for stage `stage_index` (its `shard`, for a
    stage with shards); `lineage`: the jobs its skipped stages ran in, nearest first (at most
    len(LINEAGE_TAGS))."""
    if len(lineage) > len(LINEAGE_TAGS):
        raise ValueError(f"a lineage of {len(lineage)} jobs: at most {len(LINEAGE_TAGS)} are read")
    checkout = envelope.checkout
    tags = {
        "job": envelope.job_id,
        "project": envelope.project,
        "region": envelope.region_affinity,
        "signing": f"{envelope.region_affinity}/{envelope.project}"
        if envelope.signing is not None
        else NO_GRANT,
        "git": envelope.project if checkout is not None and checkout.credentials_ref else NO_GRANT,
        # The project's release keys (relevo/<stack>/_release/<project>/…), read by the agent for a
        # stage's built-in effect: the session of that stage's attempt only, never of a command's.
        "release": envelope.project
        if stage_index < len(envelope.stages) and envelope.stages[stage_index].effect is not None
        else NO_GRANT,
        # The one log partition the attempt writes (JobPolicy's WriteItsLogAndArtifactRecords).
        "log": log_partition(envelope.job_id, stage_index, shard),
        # The project's caches in the job's region (_caches/<project>/<region>/, CACHE#<project>/<region>):
        # read by every job of the project there; written only when the envelope says its ref may.
        "cache": cache_scope(envelope.project, envelope.region_affinity),
        "cache_write": cache_scope(envelope.project, envelope.region_affinity)
        if envelope.cache_write
        else NO_GRANT,
    }
    for index, name in enumerate(LINEAGE_TAGS):
        tags[name] = lineage[index] if index < len(lineage) else NO_GRANT
    return tags


def session_seconds(envelope: JobEnvelope, stage_index: int) -> int:
    """Soon after the attempt's own deadlines end: its exec timeout (counted from the claim), the
    kill grace and one lease, plus a margin; within STS's bounds. A longer stage renews."""
    stage = envelope.stages[stage_index]
    wanted = stage.exec_timeout_sec + stage.kill_grace_sec + envelope.lease_ttl_sec + SESSION_MARGIN_SEC
    return max(MIN_SESSION_SEC, min(MAX_SESSION_SEC, wanted))


def session_name(job_id: str, stage_index: int, attempt: int, shard: int | None = None) -> str:
    """What CloudTrail shows of the session: `<job>.<stage index>.<attempt>`, for a shard
    `<job>.<stage index>.shard-<k>.<attempt>` (two shards of a stage are two sessions).
    RoleSessionName allows letters, digits, `_` and `=,.@-`, 2 to 64 characters (AssumeRole, STS
    API Reference): a job id has at most 44, a stage index 2 digits, a shard index 3
    (MAX_DECLARED_SHARDS), which leaves 4 digits for the attempt (tests/unit/test_job_credentials.py)."""
    return f"{job_id}.{stage_index}." + ("" if shard is None else f"shard-{shard}.") + str(attempt)


def mint(
    role_arn: str,
    envelope: JobEnvelope,
    stage_index: int,
    attempt: int,
    lineage: list[str],
    shard: int | None = None,
) -> JobSession:
    answer = client("sts").assume_role(
        RoleArn=role_arn,
        RoleSessionName=session_name(envelope.job_id, stage_index, attempt, shard),
        DurationSeconds=session_seconds(envelope, stage_index),
        Tags=[
            {"Key": key, "Value": value}
            for key, value in session_tags(envelope, lineage, stage_index, shard).items()
        ],
    )["Credentials"]
    return JobSession(
        access_key_id=answer["AccessKeyId"],
        secret_access_key=answer["SecretAccessKey"],
        session_token=answer["SessionToken"],
        expiration=answer["Expiration"],
    )
