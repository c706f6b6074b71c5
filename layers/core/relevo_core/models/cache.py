"""Caches: trees a project's jobs keep across jobs (dependencies, build products), declared under
the project's `caches:`, used by a stage's `cache:`, frozen into its plan (docs/caches.md).

An entry is immutable: a key is written once. It is stored like a handoff (relevo_core.models.handoff:
one manifest per root, packs and blobs named by their sha256) under the project's own prefix of the
artifact bucket, per region:

    _caches/<project>/<region>/packs/<sha256>, blobs/<sha256>   shared by every key of the project
    _caches/<project>/<region>/entries/<sha256 of the key>.json the entry's manifest

`_caches/` cannot be a project's prefix (a project id starts with a letter), so no job's prefix
(`<project>/<job>/`) holds a cache and no cache a job's objects.

A key is a template: literal text, the Mac's facts (`{xcode_build}`, `{sdk}`, ...), the workspace
path (`{workspace}`) and files' hashes (`{hash:Package.resolved}`), rendered by the agent before the
command. Restore keys are templates too, prefixes tried in order when the key has no entry.
"""

# Annotations are evaluated as written (no `from __future__ import annotations`), as in plan.py.

import fnmatch
import hashlib
import re
from collections.abc import Callable
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from relevo_core.models.handoff import Manifest, path_problem

CACHE_NAME = r"^[a-z][a-z0-9_-]{0,31}$"
MAX_CACHES = 8
MAX_CACHE_PATHS = 16
MAX_RESTORE_KEYS = 8
# A key template as declared; rendered, a hash is 16 hex digits and a fact at most MAX_FACT_CHARS.
MAX_KEY_TEMPLATE_CHARS = 200
MAX_FACT_CHARS = 64
# What a rendered key may be at most (the workspace path is hashed in, never spelled out): the
# record's sort key stays far from DynamoDB's 1,024 bytes.
MAX_KEY_CHARS = 512
HASH_CHARS = 16

# The prefix of every cache in the artifact bucket; each project's and region's under it.
CACHE_ROOT = "_caches"
# The facts a key may name: what the agent detects (relevo_agent.capabilities) and the workspace.
KEY_FACTS = ("os", "arch", "macos", "xcode", "xcode_build", "sdk", "workspace")
_TOKEN = re.compile(r"\{([^{}]*)\}")
HOME_PREFIX = "~/"

SaveWhen = Literal["on_success", "always"]
Root = Literal["workspace", "home"]


class CacheKeyError(ValueError):
    """A key template the agent could not render."""


def split_cache_path(path: str) -> tuple[Root, str]:
    """(root, path relative to it) of a declared cache path: `~/x` is under the build user's home,
    anything else under the workspace."""
    if path.startswith(HOME_PREFIX):
        return "home", path[len(HOME_PREFIX) :]
    return "workspace", path


def cache_path_problem(path: str) -> str | None:
    """Why a declared cache path could reach outside the workspace and the build user's home."""
    if path.startswith("~") and not path.startswith(HOME_PREFIX):
        return "starts with ~ but not ~/: only the build user's own home is cached"
    root, relative = split_cache_path(path)
    if root == "home" and not relative.strip("/"):
        return "is the whole home: name a directory under it"
    problem = path_problem(relative, pattern=True)
    if problem is None:
        return None
    return (
        problem.replace("handoff paths", "cache paths")
        .replace("relative to the workspace", "relative to the workspace, or under ~/")
        .replace("stay inside the workspace", "stay inside the workspace or under ~/")
    )


def key_template_problem(template: str) -> str | None:
    """Why a key (or restore key) template cannot be rendered: an unknown fact, a `{hash:...}`
    whose pattern could leave the workspace, a brace out of place, or too long."""
    if len(template) > MAX_KEY_TEMPLATE_CHARS:
        return f"is {len(template)} characters, more than {MAX_KEY_TEMPLATE_CHARS}"
    if "\0" in template or "\n" in template or "\r" in template:
        return "holds a NUL or a line break"
    for token in _TOKEN.findall(template):
        if token.startswith("hash:"):
            pattern = token.removeprefix("hash:")
            problem = path_problem(pattern, pattern=True)
            if problem:
                return (
                    f"names {{{token}}}, whose file pattern {problem.replace('handoff paths', 'key files')}"
                )
        elif token not in KEY_FACTS:
            return (
                f"names {{{token}}}, which is neither a fact the agent knows ({', '.join(KEY_FACTS)}) "
                "nor a file hash ({hash:<workspace-relative glob>})"
            )
    if "{" in _TOKEN.sub("", template) or "}" in _TOKEN.sub("", template):
        return "has a { or } that opens or closes no {fact} or {hash:<glob>}"
    return None


def render_key(template: str, facts: dict[str, str | None], file_hash: Callable[[str], str]) -> str:
    """The key: each {fact} its value ("none" when the Mac has none), {workspace} the sha256 of the
    workspace path (its first HASH_CHARS hex digits), {hash:glob} `file_hash(glob)`."""

    def one(match: re.Match[str]) -> str:
        token = match.group(1)
        if token.startswith("hash:"):
            return file_hash(token.removeprefix("hash:"))
        if token == "workspace":
            return short_sha256((facts.get("workspace") or "").encode())
        if token not in KEY_FACTS:
            raise CacheKeyError(f"unknown fact {{{token}}}")
        value = facts.get(token) or "none"
        return re.sub(r"[^A-Za-z0-9._-]", "_", value)[:MAX_FACT_CHARS]

    return _TOKEN.sub(one, template)


def short_sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:HASH_CHARS]


def key_digest(key: str) -> str:
    """The name of a key's entry object: the sha256 of the key (a key holds '/' and any text)."""
    return hashlib.sha256(key.encode()).hexdigest()


def cache_scope(project: str, region: str) -> str:
    """`<project>/<region>`: what the job session's `cache` tags name."""
    return f"{project}/{region}"


def cache_prefix(project: str, region: str) -> str:
    """The key prefix of the project's cache in that region (ends with '/')."""
    return f"{CACHE_ROOT}/{cache_scope(project, region)}/"


def entry_object(key: str) -> str:
    """An entry's manifest, relative to the cache prefix."""
    return f"entries/{key_digest(key)}.json"


def ref_may_write(ref: str, default_ref: str, write_refs: tuple[str, ...]) -> bool:
    """Whether a job of `ref` writes the project's caches: its branch is the default one, or one
    of `write_refs` (globs of branch or tag names). A pull request's ref (refs/pull/N/head, of a
    fork or not) never does."""
    if ref.startswith("refs/pull/") or ref.startswith("refs/merge-requests/"):
        return False
    name = ref.removeprefix("refs/heads/")
    patterns = write_refs or (default_ref.removeprefix("refs/heads/"),)
    return any(fnmatch.fnmatchcase(name, pattern.removeprefix("refs/heads/")) for pattern in patterns)


CachePath = Annotated[str, Field(min_length=1, max_length=1024)]


class CacheSpec(BaseModel):
    """One cache: what it holds, what its key is made of, when it is saved."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(
        pattern=CACHE_NAME,
        description="Unique in the project: a lowercase letter, then lowercase letters, digits, _ and - "
        "(at most 32). Each key is stored under it: `<name>/<key>`.",
    )
    paths: tuple[CachePath, ...] = Field(
        min_length=1,
        max_length=MAX_CACHE_PATHS,
        description="Workspace-relative paths or globs (`.venv`, `Pods`), or paths under the build user's "
        "home (`~/Library/Caches/org.swift.swiftpm`). No absolute path, no '..', nothing under .git.",
    )
    key: str = Field(
        min_length=1,
        description="The key template: text, the Mac's facts ({xcode_build}, {xcode}, {sdk}, {macos}, "
        "{arch}, {os}), {workspace} (the workspace path's hash) and files' hashes ({hash:Package.resolved}, "
        f"{{hash:**/Podfile.lock}}). At most {MAX_KEY_TEMPLATE_CHARS} characters.",
    )
    restore_keys: tuple[str, ...] = Field(
        default=(),
        max_length=MAX_RESTORE_KEYS,
        description="Templates of key prefixes tried in order when the key has no entry: the newest entry "
        "whose key starts with the first that has one is restored (a partial hit).",
    )
    save: SaveWhen = Field(
        default="on_success",
        description="on_success: saved after the command succeeds; always: after it fails too.",
    )

    @field_validator("paths")
    @classmethod
    def _paths(cls, paths: tuple[str, ...]) -> tuple[str, ...]:
        for path in paths:
            problem = cache_path_problem(path)
            if problem:
                raise ValueError(f"cache path {path!r} {problem}")
        return paths

    @field_validator("key")
    @classmethod
    def _key(cls, key: str) -> str:
        problem = key_template_problem(key)
        if problem:
            raise ValueError(f"cache key {key!r} {problem}")
        return key

    @field_validator("restore_keys")
    @classmethod
    def _restore_keys(cls, keys: tuple[str, ...]) -> tuple[str, ...]:
        for key in keys:
            problem = key_template_problem(key)
            if problem:
                raise ValueError(f"restore key {key!r} {problem}")
        return keys


# GitHub's cache, the field's reference: 10 GB a repository, entries unused for 7 days evicted
# ("Usage limits and eviction policy", docs.github.com/actions/reference/dependency-caching-reference).
DEFAULT_CACHE_BYTES = 10 * 1024**3
DEFAULT_RETENTION_DAYS = 7


class CacheLimits(BaseModel):
    """How much a project's caches keep in each region, and for how long (docs/caches.md#limits)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_total_bytes: int = Field(
        default=DEFAULT_CACHE_BYTES,
        ge=1024**2,
        le=10**13,
        description="The most the project's cache entries may total in one region (the sum of their files' "
        "sizes): past it, the least recently used entries are evicted until the total is back within it. "
        "Default: 10 GiB.",
    )
    retention_days: int = Field(
        default=DEFAULT_RETENTION_DAYS,
        ge=1,
        le=365,
        description="An entry neither saved nor restored for this many days is evicted. Default: 7.",
    )


def check_cache_names(caches: tuple[CacheSpec, ...]) -> tuple[CacheSpec, ...]:
    seen: set[str] = set()
    for cache in caches:
        if cache.name in seen:
            raise ValueError(f"cache {cache.name!r} is declared twice")
        seen.add(cache.name)
    return caches


# ------------------------------------------------------------------ what is stored


class CacheEntry(BaseModel):
    """An entry's manifest (entries/<key digest>.json): a handoff manifest per root."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True, defer_build=True)

    version: Literal[1] = 1
    key: str = Field(min_length=1, max_length=MAX_KEY_CHARS)
    trees: dict[Root, Manifest]


class CacheOutcome(BaseModel):
    """What became of one cache in one stage attempt: its restore before the command (hit, partial
    hit from a restore key, miss) and its save after it (saved, exists: the key had an entry,
    not_saved: this job's ref does not write, failed), with bytes and seconds."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    key: str
    restore: Literal["hit", "partial", "miss"]
    restored_key: str | None = None
    bytes: int = 0
    downloaded_bytes: int = 0
    restore_seconds: float = 0.0
    # The tree digest (relevo_core.models.handoff.tree_digest) of what was restored, or saved.
    digest: str | None = None
    save: Literal["saved", "exists", "not_saved", "skipped", "failed"] | None = None
    saved_bytes: int = 0
    uploaded_bytes: int = 0
    save_seconds: float = 0.0
    reason: str | None = None
