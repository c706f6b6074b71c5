"""`GET /jobs/{id}/artifacts/{name}`: a short-lived download link for one artifact a stage of the
job uploaded, with the sha256 and size the agent recorded, so the downloader can verify it.

The link is an S3 presigned GET signed with the function's own credentials (its role allows
s3:GetObject on the whole artifact bucket and nothing else in S3); nothing is read from S3 here.
So the object is never the record's `uri` as its writer (an agent) stored it: the key comes from
the job's own prefix (its envelope's artifact_uri) and the record's stage, shard and path, and a
record whose `uri` names anything else is refused, 409 LOCATION_OUTSIDE_JOB (relevo_core.models.job_objects).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from relevo_core.aws import s3_presigner
from relevo_core.models.errors import ErrorCode, RelevoError
from relevo_core.models.job_objects import JobPrefix, artifact_key, expected_key
from relevo_core.store.artifacts import ArtifactRecord, list_artifacts
from relevo_core.store.jobs import get_envelope
from relevo_core.store.keys import artifact_pk

URL_EXPIRES_SEC = 120


def artifact_summary(record: ArtifactRecord) -> dict[str, Any]:
    """An artifact as the job view lists it (`name` is what GET .../artifacts/{name} takes)."""
    return {
        "stage": record.stage,
        # The shard that left it, for a stage with shards (each shard's files are its own).
        "shard": record.shard,
        "name": record.path,
        "size": record.size,
        "sha256": record.sha256,
        "attempt": record.attempt,
        "agent_id": record.agent_id,
        "uploaded_at": record.uploaded_at,
        # Set when artifact.max_total_bytes deleted the object: the job view says so, no link is given.
        "removed_at": record.removed_at,
        "removed_reason": record.removed_reason,
    }


def stored_object(home: JobPrefix, record: ArtifactRecord) -> str:
    """The key of the artifact's object: derived from the job's prefix and the record's own name,
    and the record's `uri` must be that object (LOCATION_OUTSIDE_JOB otherwise)."""
    derived = artifact_key(home, record.stage, record.path, record.shard, record.kind == "handoff")
    return expected_key(home, record.uri, derived, (artifact_pk(record.job_id), record.sk))


def _where(record: ArtifactRecord) -> str:
    return record.stage if record.shard is None else f"{record.stage}#shard-{record.shard}"


def find_artifact(
    table: str, job_id: str, name: str, stage: str | None = None, shard: int | None = None
) -> ArtifactRecord:
    """The record of `name` (its path under the stage's artifact directory); `stage` is needed
    only when several stages left a file of that name, `shard` when several shards of one did."""
    matches = [
        record
        for record in list_artifacts(table, job_id, stage)
        if record.path == name and record.kind != "handoff" and (shard is None or record.shard == shard)
    ]
    if not matches:
        where = f" of stage {stage!r}" if stage else ""
        where += f" from shard {shard}" if shard is not None else ""
        raise RelevoError(ErrorCode.ARTIFACT_NOT_FOUND, f"job {job_id} has no artifact {name!r}{where}")
    if len(matches) > 1:
        stages = sorted({record.stage for record in matches})
        if len(stages) > 1:
            raise RelevoError(
                ErrorCode.ARTIFACT_AMBIGUOUS,
                f"stages {', '.join(stages)} each left {name!r}: name one with ?stage=",
                stages=stages,
            )
        shards = sorted(record.shard for record in matches if record.shard is not None)
        raise RelevoError(
            ErrorCode.ARTIFACT_AMBIGUOUS,
            f"shards {', '.join(str(k) for k in shards)} of stage {stages[0]!r} each left {name!r}: name "
            "one with ?shard=",
            stages=stages,
            shards=shards,
        )
    return matches[0]


def artifact_link(
    table: str, job_id: str, name: str, stage: str | None, now: datetime, shard: int | None = None
) -> dict[str, Any]:
    record = find_artifact(table, job_id, name, stage, shard)
    if record.removed_at is not None:
        raise RelevoError(
            ErrorCode.ARTIFACT_REMOVED,
            f"artifact {record.path!r} of job {job_id} stage {_where(record)!r} was removed by "
            f"{record.removed_reason} at {record.removed_at}",
            removed_at=record.removed_at,
            removed_reason=record.removed_reason,
        )
    home = JobPrefix.of(get_envelope(table, job_id).artifact_uri)
    url = s3_presigner().generate_presigned_url(
        "get_object",
        Params={"Bucket": home.bucket, "Key": stored_object(home, record)},
        ExpiresIn=URL_EXPIRES_SEC,
    )
    return {
        "job_id": job_id,
        **artifact_summary(record),
        "url": url,
        "expires_in": URL_EXPIRES_SEC,
        "expires_at": (now + timedelta(seconds=URL_EXPIRES_SEC)).isoformat(),
    }
