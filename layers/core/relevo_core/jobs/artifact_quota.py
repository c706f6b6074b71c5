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
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Callable, Iterable
from urllib.parse import urlparse

from relevo_core.aws import client
from relevo_core.models.errors import ErrorCode, RelevoError
from relevo_core.models.status import JobStatus
from relevo_core.notify.transitions import stream_images
from relevo_core.store import artifact_usage
from relevo_core.store.artifacts import ArtifactRecord, list_artifacts
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


def project_of_artifact(uri: str, job_id: str) -> str | None:
    """The project an artifact belongs to, from its object's key: intake gives every job the
    prefix `{project}/{job_id}/` (intake/enqueue.py)."""
    parts = urlparse(uri).path.lstrip("/").split("/")
    for index in range(1, len(parts)):
        if parts[index] == job_id:
            return parts[index - 1]
    return None


def _is_artifact(image: dict[str, Any] | None) -> bool:
    return bool(image) and str(image.get("pk", "")).startswith("ARTIFACTS#")


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
        was_ended = bool(old) and JobStatus(old.get("status")).terminal
    except ValueError:
        return None
    return new.get("project") if ended and not was_ended else None


def count_change(table: str, record: dict[str, Any], now_epoch: int) -> str | None:
    """Count one stream record into its project's total (once, however often it is delivered).
    Returns the project to check against its bound, or None."""
    old, new = stream_images(record)
    if not (_is_artifact(old) or _is_artifact(new)):
        return _ended_job(old, new)
    image = new or old
    assert image is not None
    project = project_of_artifact(str(image.get("uri", "")), str(image.get("job_id", "")))
    if project is None:
        log.warning("artifact record %s %s: no project in its uri %r", image.get("pk"), image.get("sk"), image.get("uri"))
        return None
    delta = stored_delta(old, new)
    if delta:
        artifact_usage.add_counted(table, project, record["eventID"], delta, now_epoch)
    return project


def _ended_jobs_oldest_first(table: str, project_id: str) -> Iterable[str]:
    for job in jobs_of_project(table, project_id, oldest_first=True):
        try:
            if JobStatus(job["status"]).terminal:
                yield job["job_id"]
        except (KeyError, ValueError):
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
        for job_id in _ended_jobs_oldest_first(table, project_id):
            stored = [record for record in list_artifacts(table, job_id) if record.removed_at is None]
            for artifact in sorted(stored, key=lambda record: (record.uploaded_at, record.stage, record.path)):
                if artifact.size > total:
                    # The total does not cover it yet (its upload is still to be counted): the
                    # remover would refuse it, so its object stays; its count comes back here.
                    refused = True
                    continue
                location = urlparse(artifact.uri)
                delete_object(location.netloc, location.path.lstrip("/"))
                if artifact_usage.remove_for_quota(table, project_id, artifact, bound, total, now):
                    total -= artifact.size
                    removed.append(artifact)
                    log.info("artifact %s of job %s stage %s (%d bytes) removed by artifact.max_total_bytes %d",
                             artifact.path, job_id, artifact.stage, artifact.size, bound)
                else:
                    refused = True
                if total <= bound:
                    break
            if total <= bound:
                break
    live_over = total > bound and not refused
    if live_over:
        if artifact_usage.note_live_over_bound(table, project_id, now):
            log.warning("project %s: %d bytes of artifacts, over artifact.max_total_bytes %d, all of live jobs (never removed)",
                        project_id, total, bound)
    elif usage.live_over_bound_at is not None:
        artifact_usage.clear_live_over_bound(table, project_id)
    return Enforcement(project_id, bound, usage.bytes, total, removed, live_over)


def delete_stored_object(bucket: str, key: str) -> None:
    """The artifact's S3 object, deleted with the function's own role (s3:DeleteObject on the
    artifact bucket only). Deleting an object already gone succeeds: a repeat is harmless."""
    client("s3").delete_object(Bucket=bucket, Key=key)


def handle_changes(
    table: str, records: list[dict[str, Any]], now: datetime, delete_object: DeleteObject = delete_stored_object
) -> list[Enforcement]:
    """One stream batch: count every change first, then check each project it touched."""
    projects: list[str] = []
    for record in records:
        project = count_change(table, record, int(now.timestamp()))
        if project and project not in projects:
            projects.append(project)
    results = [enforce(table, project, now, delete_object) for project in projects]
    return [result for result in results if result is not None]
