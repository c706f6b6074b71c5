"""After a stage succeeds: upload what it left in RELEVO_ARTIFACT_DIR to the job's artifact_uri,
each file with its sha256, read each back and compare, then record it (fenced on the attempt).

A read-back that does not match is `Relevo.Fatal.Checksum`; storage 5xx and network faults are
transient classes, other storage refusals `Relevo.Fatal.Client4xx`. Long uploads write progress
lines (bytes, percent, rate) about every 3 s, then a completion line; the files and bytes done go
to a ProgressWriter too, whose readings the stage record gets (relevo_agent.transfer).
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlparse

from boto3.s3.transfer import TransferConfig
from botocore.exceptions import (
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    ReadTimeoutError,
)

from relevo_agent.config import AgentConfig
from relevo_agent.logs import LogShipper
from relevo_agent.transfer import ProgressWriter
from relevo_core.aws import client, error_code
from relevo_core.models.envelope import JobEnvelope
from relevo_core.models.errors import ErrorClass
from relevo_core.models.transfer import human_bytes
from relevo_core.store import artifacts as artifact_store
from relevo_core.store.stage_attempts import LeaseLost, StageRef

log = logging.getLogger("relevo_agent.artifacts")

_READ_BLOCK = 1024 * 1024
PROGRESS_INTERVAL_SEC = 3.0


class ArtifactFailure(Exception):
    def __init__(self, error_class: ErrorClass, message: str) -> None:
        super().__init__(message)
        self.error_class = error_class


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(_READ_BLOCK), b""):
            digest.update(block)
    return digest.hexdigest()


def verify(expected_sha256: str, blocks: Iterable[bytes], what: str) -> None:
    """Hash what was read back; a mismatch is Relevo.Fatal.Checksum."""
    digest = hashlib.sha256()
    for block in blocks:
        digest.update(block)
    if digest.hexdigest() != expected_sha256:
        raise ArtifactFailure(
            ErrorClass.CHECKSUM, f"{what}: read back sha256 {digest.hexdigest()}, uploaded {expected_sha256}"
        )


def classify_storage_error(exc: BaseException) -> ErrorClass:
    """The error class of a failed upload or read-back (S3UploadFailedError wraps a ClientError)."""
    cause: BaseException | None = exc
    while cause is not None and not isinstance(cause, ClientError):
        if isinstance(cause, (ConnectTimeoutError, ReadTimeoutError, EndpointConnectionError)):
            return ErrorClass.NETWORK_TIMEOUT
        if isinstance(cause, ConnectionClosedError):
            return ErrorClass.CONNECTION_RESET
        cause = cause.__cause__ or cause.__context__
    if isinstance(cause, ClientError):
        status = int(cause.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        code = error_code(cause)
        if status >= 500 or code in ("InternalError", "ServiceUnavailable", "SlowDown", "RequestTimeout"):
            return ErrorClass.STORAGE_5XX
        return ErrorClass.CLIENT_4XX
    return ErrorClass.NETWORK_TIMEOUT


class Progress:
    """s3transfer callback: a progress line at most every `interval_sec`, a completion line at the end."""

    def __init__(
        self,
        name: str,
        total: int,
        emit: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic,
        interval_sec: float = PROGRESS_INTERVAL_SEC,
        on_bytes: Callable[[int], None] | None = None,
    ) -> None:
        self.name, self.total, self.emit, self.clock, self.interval_sec = (
            name,
            total,
            emit,
            clock,
            interval_sec,
        )
        self.on_bytes = on_bytes
        self.sent = 0
        self.started = clock()
        self._last = self.started

    def _rate(self, now: float) -> float:
        return self.sent / max(now - self.started, 1e-6)

    def __call__(self, amount: int) -> None:
        self.sent += amount
        if self.on_bytes is not None:
            self.on_bytes(amount)  # an addition in memory: the stage record gets it with a lease renewal
        now = self.clock()
        if now - self._last >= self.interval_sec and self.sent < self.total:
            self._last = now
            percent = 100 * self.sent / self.total if self.total else 100
            self.emit(
                f"[relevo] uploading {self.name}: {human_bytes(self.sent)} of {human_bytes(self.total)} "
                f"({percent:.0f}%) at {human_bytes(self._rate(now))}/s"
            )

    def done(self, sha256: str) -> None:
        now = self.clock()
        self.emit(
            f"[relevo] uploaded {self.name}: {human_bytes(self.total)} in {now - self.started:.1f}s "
            f"({human_bytes(self._rate(now))}/s), sha256 {sha256}"
        )


@dataclass(frozen=True)
class UploadSummary:
    records: list[artifact_store.ArtifactRecord]

    @property
    def total_bytes(self) -> int:
        return sum(r.size for r in self.records)

    @property
    def cross_region_bytes(self) -> int:
        return sum(r.cross_region_bytes for r in self.records)


def bucket_region(bucket: str) -> str:
    # GetBucketLocation answers None for us-east-1 (the API's oldest quirk, on AWS and moto alike).
    return client("s3").get_bucket_location(Bucket=bucket).get("LocationConstraint") or "us-east-1"


def check_job_quota(ref: StageRef, stage: str, files: list[Path], max_job_bytes: int | None) -> None:
    """Before any upload: the job's artifacts recorded by its other stages plus this stage's files
    must fit in max_job_bytes, or the stage fails Relevo.Fatal.ArtifactQuota with nothing uploaded
    (relevo_core.store.artifacts.check_job_quota_bytes)."""
    these = sum(path.stat().st_size for path in files)
    artifact_store.check_job_quota_bytes(ref, stage, these, max_job_bytes, what=f"{len(files)} file(s)")


def upload_artifacts(
    ref: StageRef,
    stage: str,
    artifact_dir: Path,
    artifact_uri: str,
    agent_aws_region: str | None,
    emit: Callable[[str], None],
    expires_at: int,
    transfer_config: TransferConfig | None = None,
    progress_interval_sec: float = PROGRESS_INTERVAL_SEC,
    max_job_bytes: int | None = None,
    transfer: ProgressWriter | None = None,
) -> UploadSummary:
    """Upload, verify and record every regular file under artifact_dir. Raises ArtifactFailure
    (with its error class) or LeaseLost (the records were refused: another attempt holds the stage).
    `transfer` follows the files and bytes sent and writes the last reading when the upload ends."""
    if artifact_dir.exists() and os.path.realpath(artifact_dir) != os.path.abspath(artifact_dir):
        # The build replaced it (or a directory above it) by a link: what it points at may be
        # anything the agent can read and the build cannot (run_as). Nothing is uploaded.
        raise ArtifactFailure(
            ErrorClass.HANDOFF_PATH,
            f"{artifact_dir} is no longer the directory the agent made (a symlink leads elsewhere): nothing "
            "uploaded",
        )
    files = sorted(p for p in artifact_dir.rglob("*") if p.is_file() and not p.is_symlink())
    if not files:
        return UploadSummary(records=[])
    try:
        check_job_quota(ref, stage, files, max_job_bytes)
    except ArtifactFailure:
        raise
    except artifact_store.QuotaExceeded as exc:
        raise ArtifactFailure(ErrorClass.ARTIFACT_QUOTA, str(exc)) from None
    except Exception as exc:
        raise ArtifactFailure(classify_storage_error(exc), f"the job's artifact records: {exc}") from exc
    parsed = urlparse(artifact_uri)
    bucket, prefix = parsed.netloc, parsed.path.lstrip("/")
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    s3 = client("s3")
    try:
        region = bucket_region(bucket)
    except Exception as exc:
        raise ArtifactFailure(classify_storage_error(exc), f"bucket {bucket}: {exc}") from exc
    if transfer is not None:
        transfer.start(len(files), sum(path.stat().st_size for path in files))
    records: list[artifact_store.ArtifactRecord] = []
    # A shard's files are its own: shards leaving one name never overwrite each other's object.
    stage_folder = f"{stage}/" if ref.shard is None else f"{stage}/shard-{ref.shard}/"
    for path in files:
        relative = path.relative_to(artifact_dir).as_posix()
        s3_key = f"{prefix}{stage_folder}{relative}"
        size = path.stat().st_size
        sha256 = sha256_file(path)
        if transfer is not None:
            transfer.begin(relative)
        progress = Progress(
            relative,
            size,
            emit,
            interval_sec=progress_interval_sec,
            on_bytes=transfer.sent if transfer else None,
        )
        try:
            s3.upload_file(
                str(path),
                bucket,
                s3_key,
                ExtraArgs={"Metadata": {"sha256": sha256}},
                Callback=progress,
                Config=transfer_config or TransferConfig(),
            )
            body = s3.get_object(Bucket=bucket, Key=s3_key)["Body"]
            verify(sha256, body.iter_chunks(_READ_BLOCK), f"s3://{bucket}/{s3_key}")
        except ArtifactFailure:
            raise
        except Exception as exc:
            raise ArtifactFailure(classify_storage_error(exc), f"s3://{bucket}/{s3_key}: {exc}") from exc
        progress.done(sha256)
        record = artifact_store.ArtifactRecord(
            job_id=ref.job_id,
            stage=stage,
            path=relative,
            uri=f"s3://{bucket}/{s3_key}",
            size=size,
            sha256=sha256,
            bucket_region=region,
            # The Mac's own region against the bucket's (unknown: nothing is claimed to cross).
            cross_region_bytes=size if agent_aws_region is not None and region != agent_aws_region else 0,
            attempt=ref.attempt,
            agent_id=ref.agent_id,
            uploaded_at=datetime.now(UTC).isoformat(),
            shard=ref.shard,
        )
        artifact_store.record(ref, record, expires_at)
        records.append(record)
        if transfer is not None:
            transfer.file_done()
    summary = UploadSummary(records=records)
    artifact_store.record_totals(ref, len(records), summary.total_bytes, summary.cross_region_bytes)
    if transfer is not None:
        transfer.finish(succeeded=True)
    return summary


def upload_stage_artifacts(
    ref: StageRef,
    stage: str,
    artifact_dir: Path,
    envelope: JobEnvelope,
    config: AgentConfig,
    shipper: LogShipper,
    fenced: threading.Event,
    transfer: ProgressWriter | None = None,
) -> ErrorClass | None:
    """The service's call: None when every artifact is stored, verified and recorded; otherwise
    the error class the stage fails with. Progress goes to the job's log and the agent's, and to
    `transfer` (the attempt's, which the lease keeper writes on the stage record). A record
    refused because another attempt holds the stage sets `fenced` (the stage's lease-lost flag).
    The objects go under the job's artifact_uri; the records expire with the job (its ttl)."""

    def emit(line: str) -> None:
        line = shipper.masker.mask(line)  # the agent's own log is on disk too
        log.info("%s/%s %s", ref.job_id, stage, line)
        shipper.line(line)

    # Where this Mac is (config network_region), not where the stack is: the bucket is the stack's.
    agent_region = config.location_region
    try:
        summary = upload_artifacts(
            ref,
            stage,
            artifact_dir,
            envelope.artifact_uri,
            agent_region,
            emit,
            expires_at=envelope.ttl,
            max_job_bytes=envelope.artifact_max_job_bytes,
            transfer=transfer,
            # s3transfer's max_bandwidth caps the bytes per second each file is read and sent at.
            transfer_config=TransferConfig(max_bandwidth=config.artifact_upload_max_bandwidth),
        )
    except ArtifactFailure as exc:
        if transfer is not None:
            transfer.finish_quietly(succeeded=False)
        emit(f"[relevo] artifact upload failed: {exc.error_class.value}: {exc}")
        return exc.error_class
    except LeaseLost:
        emit("[relevo] artifact records refused: the attempt is no longer held")
        fenced.set()
        return None
    if summary.records:
        emit(
            f"[relevo] {len(summary.records)} artifact(s), {human_bytes(summary.total_bytes)} stored"
            + (
                f", {human_bytes(summary.cross_region_bytes)} across regions"
                if summary.cross_region_bytes
                else ""
            )
        )
    return None
