"""Where a job's objects are in the artifact bucket, and the one check of a location read from a
record an agent wrote.

Intake gives every job the prefix `s3://<bucket>/<project>/<job>/` (the envelope's `artifact_uri`,
written by the functions only). Everything of the job lies under it: the files its stages left
(`<stage>/[shard-<k>/]<path>`), its handoff objects and manifests (`.relevo-handoff/`), the bodies
of its large log chunks (`.relevo-logs/`).

An agent holding a job's session may put any item in its job's agent-written partitions
(ARTIFACTS#, LOGS#, STAGES#), with any attributes: a stored location (an artifact's `uri`, a log
chunk's `body`, a handoff manifest) says what its writer chose. Whoever acts on one with the
functions' roles (which reach the whole bucket) derives the key from the job and the record's own
name where it can, and checks what it reads against the job's prefix here where it cannot
(`object_key`): a location outside it is refused with LOCATION_OUTSIDE_JOB and logged with the
record's key. tests/unit/test_job_objects.py lists every reader and remover that goes through here.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from urllib.parse import unquote

from relevo_core.models.errors import ErrorCode, RelevoError

# A stage's handoff objects (packs, blobs, manifests) are under the job's prefix, in HANDOFF_DIR.
from relevo_core.models.handoff import HANDOFF_DIR, manifest_name
from relevo_core.models.test_results import TESTS_DIR

log = logging.getLogger("relevo_core.models.job_objects")


@dataclass(frozen=True)
class JobPrefix:
    """The job's place in the artifact bucket, from its envelope's artifact_uri."""

    bucket: str
    prefix: str  # `<project>/<job>/`, always ending in '/'

    @classmethod
    def of(cls, artifact_uri: str) -> JobPrefix:
        bucket, _, prefix = artifact_uri.removeprefix("s3://").partition("/")
        if not artifact_uri.startswith("s3://") or not bucket or not prefix.strip("/"):
            raise ValueError(f"{artifact_uri!r} is not a job's artifact_uri (s3://bucket/project/job/)")
        return cls(bucket, prefix if prefix.endswith("/") else prefix + "/")

    def uri(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"

    def __str__(self) -> str:
        return self.uri(self.prefix)


def _bad_segment(key: str) -> str | None:
    for segment in key.split("/"):
        if segment in ("", ".", ".."):
            return f"an empty, '.' or '..' segment ({segment!r})"
    if any(character in key for character in "\0\r\n\\"):
        return "a NUL, line break or backslash"
    return None


def _why_outside(home: JobPrefix, location: str) -> tuple[str | None, str]:
    """(why `location` is not an object under `home`, or None; its key)."""
    if not isinstance(location, str) or not location.startswith("s3://"):
        return "is not an s3:// URI", ""
    bucket, slash, key = location.removeprefix("s3://").partition("/")
    if bucket != home.bucket or not slash:
        return f"names bucket {bucket!r}, not the job's {home.bucket!r}", key
    # A path prefix, not a string prefix: `<project>/<job>x/...` is another job's.
    if not key.startswith(home.prefix) or key == home.prefix:
        return f"is not under the job's prefix {home.prefix!r}", key
    # Nothing that a client, a proxy or S3's own URL handling could resolve elsewhere: no `..`,
    # `.` or `//`, raw or percent-encoded (`%2e%2e`, `%2f`).
    for form in (key, unquote(key)):
        problem = _bad_segment(form)
        if problem:
            return f"holds {problem}", key
    return None, key


def object_key(home: JobPrefix, location: str, record: tuple[str, str]) -> str:
    """The key of `location` (`s3://bucket/key`, read from the agent-written item `record`, its
    (pk, sk)) when it is an object under the job's own prefix in the job's bucket; otherwise
    RelevoError LOCATION_OUTSIDE_JOB, logged with the record's key and the location."""
    problem, key = _why_outside(home, location)
    if problem is None:
        return key
    pk, sk = record
    log.warning("record %s %s: location %r %s (job prefix %s): refused", pk, sk, location, problem, home)
    raise RelevoError(
        ErrorCode.LOCATION_OUTSIDE_JOB,
        f"record {pk} {sk} names a location that {problem}: it is not one of the job's objects ({home}), so "
        "nothing is done with it",
        pk=pk,
        sk=sk,
    )


def expected_key(home: JobPrefix, location: str, derived: str, record: tuple[str, str]) -> str:
    """`derived` (the key the record's own name gives under the job's prefix), when the stored
    `location` is that very object; otherwise LOCATION_OUTSIDE_JOB: outside the job (object_key),
    or another object of it than the one the record names."""
    key = object_key(home, location, record)
    if key != derived:
        pk, sk = record
        log.warning(
            "record %s %s: location %r is not its own object %r: refused", pk, sk, location, home.uri(derived)
        )
        raise RelevoError(
            ErrorCode.LOCATION_OUTSIDE_JOB,
            f"record {pk} {sk} names {location!r}, not the object its name gives ({home.uri(derived)}): "
            "nothing is done with it",
            pk=pk,
            sk=sk,
        )
    # The derived key passes the same check (a record's own name could hold a `..`).
    return object_key(home, home.uri(derived), record)


def artifact_key(home: JobPrefix, stage: str, path: str, shard: int | None, handoff: bool) -> str:
    """Where a stage's file is: `<stage>/[shard-<k>/]<path>` (relevo_agent.artifacts), or a
    handoff object, whose path already starts with `.relevo-handoff/` (shared by the job's stages)."""
    if handoff:
        return f"{home.prefix}{path}"
    return f"{home.prefix}{stage}/{'' if shard is None else f'shard-{shard}/'}{path}"


def handoff_prefix(home: JobPrefix) -> str:
    return f"{home.prefix}{HANDOFF_DIR}/"


def test_results_key(home: JobPrefix, stage: str, shard: int | None, attempt: int) -> str:
    """A stage attempt's results document (relevo_core.models.test_results), a shard's its own,
    each attempt numbered apart as its handoff manifest is."""
    return f"{home.prefix}{TESTS_DIR}/{stage}{'' if shard is None else f'.shard-{shard}'}.{attempt}.json"


def manifest_key(home: JobPrefix, stage: str, shard: int | None, attempt: int) -> str:
    """A stage attempt's handoff manifest (a shard's its own, each attempt numbered apart)."""
    return f"{handoff_prefix(home)}{manifest_name(stage, shard, attempt)}"


def test_listing_key(home: JobPrefix, stage: str, listing_sha256: str) -> str:
    """A sharded stage's test listing as a shard stored it: named by its sha256, so the route
    derives the key from what the request says, and never reads a location it was handed."""
    return f"{home.prefix}{TESTS_DIR}/{stage}.listing.{listing_sha256}.txt"


def test_plan_key(home: JobPrefix, stage: str, shard: int) -> str:
    """A sharded stage's test plan, as the shard whose request made it stored it (each shard's
    its own key: two racing shards never overwrite each other's; the record names the winner's)."""
    return f"{home.prefix}{TESTS_DIR}/{stage}.plan.shard-{shard}.json"
