"""artifact.max_total_bytes (issue 20): a project's stored artifacts stay within a bound.

Run off the table stream (functions/artifact_quota), never in the agent's upload path and never
failing a job. Each artifact record's change is counted into the project's running total
(store/artifact_usage.py); then every project the batch touched, or whose job just ended, is
checked: while its total is over the bound, the artifacts of its oldest ended jobs (ProjectJobsIndex,
oldest first: a Query, never a Scan) are removed, oldest upload first: the S3 object deleted, the
record marked `removed_at` / `removed_reason`, the job's audit trail given an entry. Artifacts of
live jobs are never touched; when only they are left over the bound it is recorded on the usage
item and logged once.

The S3 delete comes before the mark: a crash between them leaves a stored-looking record whose
object is gone, and the retried batch deletes again (a delete of a missing key succeeds) and marks
it.
The bucket is versioned, so the delete leaves a delete marker and the lifecycle rule's
NoncurrentVersionExpiration (1 day) frees the bytes.

An artifact record is its agent's to write, whole: its job is the partition's (`ARTIFACTS#<job>`,
held to it by IAM), never its `job_id` or `uri` attributes. Its project is its job record's, and
the object deleted is the one its stage, shard and path give under the job's own prefix; a record
whose `uri` names anything else (another project's object) is neither counted nor removed, only
logged (relevo_core.models.job_objects: LOCATION_OUTSIDE_JOB).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from relevo_core.aws import client
from relevo_core.jobs.artifacts import stored_object
from relevo_core.models.errors import ErrorCode, RelevoError
from relevo_core.models.job_objects import JobPrefix
from relevo_core.models.status import JobStatus
from relevo_core.notify.transitions import stream_images
from relevo_core.store import artifact_usage
from relevo_core.store.artifacts import ArtifactRecord, list_artifacts
from relevo_core.store.codec import envelope_of
from relevo_core.store.jobs import get_envelope
from relevo_core.store.keys import JOB_SK
from relevo_core.store.project_jobs import jobs_of_project
from relevo_core.store.projects import get_project

log = logging.getLogger("relevo_core.artifact_quota")

DeleteObject = Callable[[str, str], None]


@dataclass(frozen=True)
class Enforcement:
    project: str
    bound: int
    total_before: int
    total_after: int
    removed: list[ArtifactRecord]
    live_over_bound: bool


@dataclass(frozen=True)
class JobHome:
    project: str
    prefix: JobPrefix


def job_home(table: str, job_id: str, homes: dict[str, JobHome | None]) -> JobHome | None:
    """The job's project and prefix, from its record (the functions' writing); None once the job
    record is gone. `homes`: what this batch already read."""
    if job_id not in homes:
        try:
            envelope = get_envelope(table, job_id)
            homes[job_id] = JobHome(envelope.project, JobPrefix.of(envelope.artifact_uri))
        except RelevoError as exc:
            if exc.code is not ErrorCode.JOB_NOT_FOUND:
                raise
            homes[job_id] = None
    return homes[job_id]


def home_after_job(image: dict[str, Any], job_id: str) -> JobHome | None:
    """For a change that comes after its job record went (a job deleted, or expired: its records
    go with it): the project the record's own location names, `<project>/<job>/` in its bucket.
    Only the job's own records reach here once it is gone; what its agent wrote while the job was
    there was checked against the job then."""
    bucket, _, key = str(image.get("uri", "")).removeprefix("s3://").partition("/")
    project, _, rest = key.partition("/")
    if not project or not rest.startswith(f"{job_id}/"):
        return None
    return JobHome(project, JobPrefix(bucket, f"{project}/{job_id}/"))


def checked_image(image: dict[str, Any] | None, job_id: str, home: JobHome) -> dict[str, Any] | None:
    """The image when it is a readable record whose location is its own object under the job's
    prefix; None (logged) otherwise: such a record counts for nothing."""
    if not image:
        return None
    try:
        record = ArtifactRecord.model_validate({**image, "job_id": job_id})
        if record.sk != image.get("sk"):
            raise ValueError(f"its stage, shard and path give {record.sk!r}")
        stored_object(home.prefix, record)
    except (ValidationError, ValueError) as exc:
        log.warning("artifact record %s %s is not counted: %s", image.get("pk"), image.get("sk"), exc)
        return None
    except RelevoError as exc:
        if exc.code is not ErrorCode.LOCATION_OUTSIDE_JOB:
            raise
        return None  # logged by job_objects, with the record's key and its location
    return image


def _is_artifact(image: dict[str, Any] | None) -> bool:
    return bool(image and str(image.get("pk", "")).startswith("ARTIFACTS#"))


def stored_delta(old: dict[str, Any] | None, new: dict[str, Any] | None) -> int:
    """What one artifact record's change adds to its project's total. A stored record becoming
    removed adds nothing here: the remover took its size off in the same transaction as the mark."""
    if old and new and new.get("removed_at") and not old.get("removed_at"):
        return 0
    return artifact_usage.counted_bytes(new) - artifact_usage.counted_bytes(old)


def _ended_job(old: dict[str, Any] | None, new: dict[str, Any] | None) -> str | None:
    """The project of a job record whose change ended the job."""
    if not new or new.get("sk") != JOB_SK:
        return None
    try:
        ended = JobStatus(new.get("status")).terminal
        was_ended = bool(old and JobStatus(old.get("status")).terminal)
    except ValueError:
        return None
    return new.get("project") if ended and not was_ended else None


def count_change(
    table: str, record: dict[str, Any], now_epoch: int, homes: dict[str, JobHome | None] | None = None
) -> str | None:
    """Count one stream record into its project's total (once, however often it is delivered).
    Returns the project to check against its bound, or None."""
    old, new = stream_images(record)
    if not (_is_artifact(old) or _is_artifact(new)):
        return _ended_job(old, new)
    image = new or old
    assert image is not None
    job_id = str(image["pk"]).removeprefix("ARTIFACTS#")
    home = job_home(table, job_id, {} if homes is None else homes) or home_after_job(image, job_id)
    if home is None:
        log.warning(
            "artifact record %s %s: its job is gone and its uri %r names no project of it",
            image.get("pk"),
            image.get("sk"),
            image.get("uri"),
        )
        return None
    old, new = checked_image(old, job_id, home), checked_image(new, job_id, home)
    project = home.project
    delta = stored_delta(old, new)
    if delta:
        artifact_usage.add_counted(table, project, record["eventID"], delta, now_epoch)
    return project


def _ended_jobs_oldest_first(table: str, project_id: str) -> Iterable[tuple[str, JobPrefix]]:
    """(job id, the job's prefix from its envelope) of the project's ended jobs, oldest first."""
    for job in jobs_of_project(table, project_id, oldest_first=True):
        try:
            if JobStatus(job["status"]).terminal:
                yield job["job_id"], JobPrefix.of(envelope_of(job)["artifact_uri"])
        except (KeyError, TypeError, ValueError):
            continue


def enforce(table: str, project_id: str, now: datetime, delete_object: DeleteObject) -> Enforcement | None:
    """Bring the project's stored artifacts back within artifact.max_total_bytes; None when the
    project has no bound (or is gone)."""
    try:
        bound = get_project(table, project_id).artifact.max_total_bytes
    except RelevoError as exc:
        if exc.code is ErrorCode.PROJECT_NOT_FOUND:
            return None
        raise
    if bound is None:
        return None
    usage = artifact_usage.get_usage(table, project_id)
    total = usage.bytes
    removed: list[ArtifactRecord] = []
    # An ended job's artifact the remover refused (replaced meanwhile, or not counted yet): the
    # overrun is not the live jobs' alone, and the next change comes back to it.
    refused = False
    if total > bound:
        for job_id, home in _ended_jobs_oldest_first(table, project_id):
            stored = [record for record in list_artifacts(table, job_id) if record.removed_at is None]
            for artifact in sorted(
                stored, key=lambda record: (record.uploaded_at, record.stage, record.path)
            ):
                try:
                    # The job's own object by the record's name, never the uri its agent wrote.
                    object_key = stored_object(home, artifact)
                except RelevoError as exc:
                    if exc.code is not ErrorCode.LOCATION_OUTSIDE_JOB:
                        raise
                    continue  # never counted (count_change): nothing to delete, logged
                if artifact.size > total:
                    # The total does not cover it yet (its upload is still to be counted): the
                    # remover would refuse it, so its object stays; its count comes back here.
                    refused = True
                    continue
                delete_object(home.bucket, object_key)
                if artifact_usage.remove_for_quota(table, project_id, artifact, bound, total, now):
                    total -= artifact.size
                    removed.append(artifact)
                    log.info(
                        "artifact %s of job %s stage %s (%d bytes) removed by artifact.max_total_bytes %d",
                        artifact.path,
                        job_id,
                        artifact.stage,
                        artifact.size,
                        bound,
                    )
                else:
                    refused = True
                if total <= bound:
                    break
            if total <= bound:
                break
    live_over = total > bound and not refused
    if live_over:
        if artifact_usage.note_live_over_bound(table, project_id, now):
            log.warning(
                "project %s: %d bytes of artifacts, over artifact.max_total_bytes %d, all of live jobs "
                "(never removed)",
                project_id,
                total,
                bound,
            )
    elif usage.live_over_bound_at is not None:
        artifact_usage.clear_live_over_bound(table, project_id)
    return Enforcement(project_id, bound, usage.bytes, total, removed, live_over)


def delete_stored_object(bucket: str, key: str) -> None:
    """The artifact's S3 object, deleted with the function's own role (s3:DeleteObject on the
    artifact bucket only). Deleting an object already gone succeeds: a repeat is harmless."""
    client("s3").delete_object(Bucket=bucket, Key=key)


def handle_changes(
    table: str,
    records: list[dict[str, Any]],
    now: datetime,
    delete_object: DeleteObject = delete_stored_object,
) -> list[Enforcement]:
    """One stream batch: count every change first, then check each project it touched."""
    projects: list[str] = []
    homes: dict[str, JobHome | None] = {}
    for record in records:
        project = count_change(table, record, int(now.timestamp()), homes)
        if project and project not in projects:
            projects.append(project)
    results = [enforce(table, project, now, delete_object) for project in projects]
    return [result for result in results if result is not None]
