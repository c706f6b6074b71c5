"""A directory artifact as one `.tar.gz`. The agent uploads a directory it finds under
RELEVO_ARTIFACT_DIR file by file (one artifact record and one S3 object per file, named by its
path: relevo_agent.artifacts); the console gathers the files whose path starts with the directory,
each through its presigned link and checked against its recorded sha256 and size
(relevo_cli.artifacts.download, as `relevo artifact download` does), into a temporary directory, then
writes the archive there. It is complete before the first byte is sent, so the response carries
its Content-Length and the browser shows a native download with its size.

The archive is the same bytes for the same files: members in path order, each with the time it
was uploaded, no owner, mode 0644 (S3 keeps no file mode), and a gzip header without a time.
"""

from __future__ import annotations

import gzip
import tarfile
from datetime import datetime
from pathlib import Path
from typing import Any

from relevo_cli.api import RelevoApi
from relevo_cli.artifacts import download


def directory_of(name: str) -> str | None:
    """The top directory an artifact's path is in (None: a file at the top)."""
    head, sep, _ = name.partition("/")
    return head if sep else None


def stored(artifacts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The artifacts still stored: one removed by the project's artifact.max_total_bytes keeps
    its record (removed_at) but has no object to download."""
    return [artifact for artifact in artifacts if not artifact.get("removed_at")]


def artifact_directories(artifacts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The top directories of each stage's (each shard's) stored artifacts: stage, shard (None
    for a stage without shards), name, files, size (in bytes)."""
    found: dict[tuple[str, int, str], dict[str, Any]] = {}
    for artifact in stored(artifacts):
        directory = directory_of(artifact["name"])
        if directory is None:
            continue
        shard = artifact.get("shard")
        entry = found.setdefault(
            (artifact["stage"], -1 if shard is None else shard, directory),
            {"stage": artifact["stage"], "shard": shard, "name": directory, "files": 0, "size": 0},
        )
        entry["files"] += 1
        entry["size"] += int(artifact["size"])
    return [found[key] for key in sorted(found)]


class NoSuchDirectory(LookupError):
    pass


def directory_tarball(
    api: RelevoApi, job: dict[str, Any], stage: str, directory: str, workdir: Path, shard: int | None = None
) -> Path:
    """Download the files of `directory` (from `stage`'s artifacts, or its shard's) and archive
    them as workdir/<directory>.tar.gz. Raises NoSuchDirectory, ApiError, or ChecksumMismatch."""
    files = sorted(
        (
            a
            for a in stored(job.get("artifacts") or [])
            if a["stage"] == stage and a.get("shard") == shard and directory_of(a["name"]) == directory
        ),
        key=lambda a: a["name"],
    )
    if not files:
        of_shard = "" if shard is None else f" shard {shard}"
        raise NoSuchDirectory(
            f"job {job['job_id']} has no artifact directory {directory!r} of stage {stage!r}{of_shard}"
        )
    tree = workdir / "files"
    for artifact in files:
        target = tree / artifact["name"]
        target.parent.mkdir(parents=True, exist_ok=True)
        download(api.artifact_link(job["job_id"], artifact["name"], stage, shard), target)
    archive = workdir / f"{directory}.tar.gz"
    with (
        archive.open("wb") as raw,
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as zipped,
        tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for artifact in files:
            path = tree / artifact["name"]
            info = tarfile.TarInfo(artifact["name"])
            info.size = path.stat().st_size
            info.mode = 0o644
            uploaded = artifact.get("uploaded_at")
            info.mtime = int(datetime.fromisoformat(uploaded).timestamp()) if uploaded else 0
            with path.open("rb") as handle:
                tar.addfile(info, handle)
    return archive
