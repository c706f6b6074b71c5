"""What travels from one stage of a job to the next: the files a stage hands on (`handoff:`, kept
with a manifest under the job's artifact_uri) and the values it writes to $RELEVO_OUTPUT.

Shared by the project file's validation (a path that would escape the workspace is refused at
`relevo project apply`), the agent (which stores and restores them) and the job view (which shows
them). docs/handoff.md is the reference.
"""

# Annotations are evaluated as written (no `from __future__ import annotations`), as in plan.py.

import builtins
import hashlib
import posixpath
import re
from dataclasses import dataclass
from typing import Final, Literal
from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict, Field, field_serializer, field_validator

# ------------------------------------------------------------------ paths

# A handoff pattern or a manifest path: workspace-relative, '/'-separated.
MAX_PATH_CHARS = 1024
MAX_PATTERNS = 32


def path_problem(path: str, pattern: bool = False) -> str | None:
    """Why `path` (a manifest path, or with `pattern` a declared glob) could reach outside the
    workspace or into its repository, or None when it cannot: no absolute path, no `~`, no `..`,
    no empty or `.` component, nothing under `.git`, no NUL or newline."""
    if not path:
        return "is empty"
    if len(path) > MAX_PATH_CHARS:
        return f"is longer than {MAX_PATH_CHARS} characters"
    if "\0" in path or "\n" in path or "\r" in path:
        return "holds a NUL or a line break"
    if path.startswith("/"):
        return "is absolute: handoff paths are relative to the workspace"
    if path.startswith("~"):
        return "starts with ~: handoff paths are relative to the workspace"
    body = path[2:] if pattern and path.startswith("./") else path
    parts = body.split("/")
    if pattern and parts and parts[-1] == "":
        parts = parts[:-1]  # `build/` names the directory
    for part in parts:
        if part == "..":
            return "climbs out with '..': handoff paths stay inside the workspace"
        if part in ("", "."):
            return "has an empty or '.' component"
        if part == ".git":
            return "reaches into .git: the checkout's repository is the agent's, never handed on"
    return None


def normal_pattern(pattern: str) -> str:
    """A declared pattern as the agent matches it (no leading './', no trailing '/')."""
    pattern = pattern[2:] if pattern.startswith("./") else pattern
    return pattern.rstrip("/")


def _pattern_regex(pattern: str) -> "re.Pattern[str]":
    """A handoff glob as the agent's glob.glob(recursive=True) reads it: `**` any depth of
    directories, `*` and `?` within one component, `[...]` a set."""
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        elif pattern[i] == "[" and "]" in pattern[i + 2 :]:
            end = pattern.index("]", i + 2)
            body = pattern[i + 1 : end]
            out, i = (
                out + "[" + ("^" + re.escape(body[1:]) if body[:1] == "!" else re.escape(body)) + "]",
                end + 1,
            )
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out)


def pattern_covers(pattern: str, path: str) -> bool:
    """Whether handing on `pattern` hands on the file `path` (both workspace-relative): the pattern
    matches it, or a directory above it."""
    regex = _pattern_regex(normal_pattern(pattern))
    parts = path.split("/")
    return any(regex.fullmatch("/".join(parts[:depth])) for depth in range(1, len(parts) + 1))


def link_target_problem(path: str, target: str) -> str | None:
    """Why a symlink at `path` pointing at `target` would lead out of the workspace, or None.
    Bundles link within themselves (`Versions/Current -> A`), relatively; an absolute target or
    one that climbs above the workspace is refused, at store and at restore."""
    if not target or "\0" in target:
        return "has an empty target"
    if target.startswith("/"):
        return f"points at the absolute path {target!r}, outside the workspace"
    joined = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
    if joined == ".." or joined.startswith("../"):
        return f"points at {target!r}, outside the workspace"
    if joined == ".git" or joined.startswith(".git/"):
        return f"points at {target!r}, into the checkout's .git"
    return None


# ------------------------------------------------------------------ where it is stored

# Under the job's artifact_uri: the handoff's objects and manifests (relevo_agent.handoff.store).
HANDOFF_DIR = ".relevo-handoff"


def handoff_base(artifact_uri: str) -> tuple[str, str]:
    """(bucket, key prefix of the job's handoff objects) for a job's artifact_uri."""
    parsed = urlparse(artifact_uri)
    prefix = parsed.path.lstrip("/")
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    return parsed.netloc, f"{prefix}{HANDOFF_DIR}/"


def manifest_name(stage: str, shard: int | None, attempt: int) -> str:
    """The manifest of an attempt of `stage` (or of its shard), under the job's handoff directory:
    the one spelling of it (relevo_core.models.job_objects derives the same key from a job's prefix)."""
    return f"manifests/{stage}{'' if shard is None else f'.shard-{shard}'}.{attempt}.json"


def manifest_key(artifact_uri: str, stage: str, shard: int | None, attempt: int) -> tuple[str, str]:
    """(bucket, key) of the manifest an attempt of `stage` (or of its shard) stores: derived from
    the job's artifact_uri, so whoever acts on it need not trust a location an agent recorded."""
    bucket, prefix = handoff_base(artifact_uri)
    return bucket, f"{prefix}{manifest_name(stage, shard, attempt)}"


def base_of_manifest(manifest_uri: str) -> tuple[str, str]:
    """(bucket, handoff prefix) a manifest's object keys are relative to: the handoff_base of the
    job that stored it, read back from the manifest's own location."""
    parsed = urlparse(manifest_uri)
    key = parsed.path.lstrip("/")
    return parsed.netloc, key[: key.rindex("manifests/")]


# A manifest entry's `object`, relative to the handoff prefix: named by the sha256 of its bytes, so
# a retry or a later stage of the job that hands on the same bytes stores nothing again.
def pack_object(sha256: str) -> str:
    """The pack of small files whose bytes (all of them, one after another) have this sha256."""
    return f"packs/{sha256}"


def blob_object(sha256: str) -> str:
    """A large file stored whole, by the sha256 of its bytes."""
    return f"blobs/{sha256}"


# ------------------------------------------------------------------ the manifest

MANIFEST_VERSION: Final = 1
# Files at least this large are stored whole, one object each (blobs/<sha256>), uploaded and
# fetched in parallel parts; smaller ones are packed together (packs/<sha256>), so a tree of
# thousands of small files (an .xcarchive, a .framework) costs a few requests, not thousands.
LARGE_FILE_BYTES = 8 * 1024 * 1024
# A pack is built in one buffer of the agent's, several in flight: the size bounds its memory.
PACK_BYTES = 4 * 1024 * 1024

EntryType = Literal["file", "dir", "symlink"]
ENTRY_TYPES = ("file", "dir", "symlink")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_OBJECT = re.compile(r"^(packs|blobs)/[0-9a-f]{64}$")
# A manifest's rows, in this order: what each entry says of its path.
ENTRY_FIELDS = ("path", "type", "mode", "mtime_ns", "size", "sha256", "target", "object", "offset")


@dataclass(frozen=True, slots=True)
class ManifestEntry:
    """One path of a handed-on tree, as the stage left it. A plain slotted record, checked as it
    is read (`from_row`): a tree of 20,000 files is 20,000 of them in the agent's memory."""

    path: str
    type: str
    # Permission bits (stat.S_IMODE): executables stay executable.
    mode: int
    mtime_ns: int
    size: int = 0
    sha256: str | None = None
    target: str | None = None
    # Where a file's bytes are: an object key relative to the job's handoff prefix, and the
    # offset of the file in it (a pack holds many files, a blob one).
    object: str | None = None
    offset: int = 0

    def __post_init__(self) -> None:
        problem = self.problem()
        if problem:
            raise ValueError(f"manifest entry {self.path!r}: {problem}")

    def problem(self) -> str | None:
        """What makes the entry unreadable as a record (its path's safety is checked apart)."""
        if not isinstance(self.path, str) or not 0 < len(self.path) <= MAX_PATH_CHARS:
            return "the path is not a string of 1 to 1024 characters"
        if self.type not in ENTRY_TYPES:
            return f"type {self.type!r} is not one of {', '.join(ENTRY_TYPES)}"
        for name in ("mode", "mtime_ns", "size", "offset"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                return f"{name} is not an integer"
        if not 0 <= self.mode <= 0o7777 or self.size < 0 or self.offset < 0:
            return "mode, size or offset out of range"
        if self.sha256 is not None and not (isinstance(self.sha256, str) and _SHA256.match(self.sha256)):
            return "sha256 is not 64 hex digits"
        if self.object is not None and not (isinstance(self.object, str) and _OBJECT.match(self.object)):
            return "object is not packs/<sha256> or blobs/<sha256>"
        if self.target is not None and not (
            isinstance(self.target, str) and len(self.target) <= MAX_PATH_CHARS
        ):
            return "target is not a string of at most 1024 characters"
        return None

    def row(self) -> list[builtins.object]:
        return [getattr(self, name) for name in ENTRY_FIELDS]

    @classmethod
    def from_row(cls, row: builtins.object) -> "ManifestEntry":
        if not isinstance(row, list) or len(row) != len(ENTRY_FIELDS):
            raise ValueError(
                f"a manifest row is a list of {len(ENTRY_FIELDS)} values ({', '.join(ENTRY_FIELDS)})"
            )
        return cls(*row)


# The models below are built on their first use (defer_build): the run plan's validation imports
# this module for its path and name rules only, and a function that reads projects (the webhook's)
# never validates a manifest or a summary.
class Manifest(BaseModel):
    """Everything one stage attempt handed on (stored as JSON under the job's handoff prefix,
    its sha256 in the stage's receipt, so a manifest altered in storage fails the restore).
    Entries travel as rows of ENTRY_FIELDS: a third of the JSON, and of the parsing."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True, defer_build=True)

    version: Literal[1] = MANIFEST_VERSION
    job_id: str
    stage: str
    attempt: int
    patterns: tuple[str, ...]
    fields: tuple[str, ...] = ENTRY_FIELDS
    entries: tuple[ManifestEntry, ...]

    @field_validator("fields")
    @classmethod
    def _known_fields(cls, fields: tuple[str, ...]) -> tuple[str, ...]:
        if tuple(fields) != ENTRY_FIELDS:
            raise ValueError(f"rows of {', '.join(fields)}: this reader knows {', '.join(ENTRY_FIELDS)}")
        return fields

    @field_validator("entries", mode="before")
    @classmethod
    def _rows(cls, entries: object) -> object:
        if isinstance(entries, (list, tuple)):
            return tuple(
                entry if isinstance(entry, ManifestEntry) else ManifestEntry.from_row(entry)
                for entry in entries
            )
        return entries

    @field_serializer("entries")
    def _as_rows(self, entries: tuple[ManifestEntry, ...]) -> list[list[object]]:
        return [entry.row() for entry in entries]

    @property
    def files(self) -> list[ManifestEntry]:
        return [entry for entry in self.entries if entry.type == "file"]

    @property
    def bytes(self) -> int:
        return sum(entry.size for entry in self.files)


def tree_digest(entries: "list[ManifestEntry] | tuple[ManifestEntry, ...]") -> str:
    """One sha256 over a tree: each path's type, permission bits, mtime (ns), and its content's
    sha256 or its link target, in path order. Two trees with the same digest are the same for
    codesign: same bytes, same links, same modes, same times. A symlink's own mode is left out
    (Linux has none of its own)."""
    digest = hashlib.sha256()
    for entry in sorted(entries, key=lambda e: e.path):
        mode = "" if entry.type == "symlink" else format(entry.mode, "o")
        what = entry.sha256 if entry.type == "file" else (entry.target if entry.type == "symlink" else "")
        digest.update(f"{entry.type}\0{entry.path}\0{mode}\0{entry.mtime_ns}\0{what}\n".encode())
    return digest.hexdigest()


class HandoffSummary(BaseModel):
    """What a stage handed on, as its receipt and `relevo job view --json` carry it."""

    model_config = ConfigDict(frozen=True, extra="ignore", defer_build=True)

    manifest: str = Field(description="s3:// URI of the manifest")
    manifest_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    attempt: int
    files: int = 0
    dirs: int = 0
    symlinks: int = 0
    bytes: int = Field(0, description="the size of every file handed on")
    uploaded_bytes: int = Field(
        0, description="what this attempt stored anew (the rest was already stored for the job)"
    )
    digest: str = Field(description="tree_digest of what was handed on")
    stored_at: str
    cross_region_bytes: int | None = Field(
        0,
        description="of uploaded_bytes, what crossed AWS regions (the Mac's network_region to the "
        "bucket's); None: the Mac's region is not known",
    )
    seconds: float = 0


class RestoreSummary(BaseModel):
    """What a stage's agent restored before its command (the stage record's `restored`)."""

    model_config = ConfigDict(frozen=True, extra="ignore", defer_build=True)

    attempt: int
    agent_id: str
    from_stages: tuple[str, ...] = ()
    files: int = 0
    bytes: int = Field(0, description="the size of every file restored")
    restored_bytes: int = Field(0, description="what this Mac downloaded: 0 when every file was already here")
    cached_bytes: int = Field(0, description="copied from this Mac's handoff cache")
    present_bytes: int = Field(0, description="already in the workspace, verified")
    digest: str
    cross_region_bytes: int | None = 0
    seconds: float = 0


# ------------------------------------------------------------------ values ($RELEVO_OUTPUT)

OUTPUT_KEY = r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$"
_OUTPUT_KEY = re.compile(OUTPUT_KEY)
# Why these: every value of every earlier stage is in a later stage's environment, and macOS
# bounds a process's arguments and environment together by kern.argmax (1 MiB): 32 stages of
# 16 KiB stay under half of it. The values also ride in the stage's receipt, a DynamoDB item of
# at most 400 KB.
MAX_OUTPUT_KEYS = 64
MAX_OUTPUT_BYTES = 16 * 1024
# What a stage is handed of every earlier stage's (and shard's) values together: that half of
# kern.argmax. A job's 45 stage runs (relevo_core.plan_limits) could hand on 720 KiB, which with
# the rest of the environment might not fit: past this the stage fails before its command, with
# a line that says so, rather than with the exec's E2BIG.
MAX_HANDED_ON_OUTPUT_BYTES = 512 * 1024


def output_key_problem(key: str) -> str | None:
    if not _OUTPUT_KEY.match(key):
        return f"{key!r} is not an output name (a letter or _, then letters, digits, _ and -, at most 64)"
    return None


def variable_part(name: str) -> str:
    """A stage name or output key as it appears in a variable name: upper case, '-' as '_'."""
    return name.upper().replace("-", "_")


def shard_variable_part(stage: str, shard: int) -> str:
    """How a shard's values are named: <STAGE>_SHARD<k> (k as RELEVO_SHARD_INDEX, 0-based)."""
    return f"{variable_part(stage)}_SHARD{shard}"


def output_variable(stage: str, key: str, shard: int | None = None) -> str:
    """What a later stage sees: RELEVO_OUT_<STAGE>_<KEY>, or of a stage with shards, each shard's
    as RELEVO_OUT_<STAGE>_SHARD<k>_<KEY> (docs/handoff.md, "Stages with shards")."""
    where = variable_part(stage) if shard is None else shard_variable_part(stage, shard)
    return f"RELEVO_OUT_{where}_{variable_part(key)}"


def previous_output_variable(key: str) -> str:
    """What a reconcile's effect probe sees of the previous attempt's values."""
    return f"RELEVO_PREVIOUS_OUT_{variable_part(key)}"


def outputs_size(outputs: dict[str, str]) -> int:
    return sum(len(key.encode()) + len(value.encode()) for key, value in outputs.items())
