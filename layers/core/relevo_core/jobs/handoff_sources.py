"""What a stage stands on: its job's envelope and the earlier stages whose files and values it
gets (their receipts), read in one Query of the job's partition; for a job started from a later
stage (a rerun --from-stage, a dead-letter redrive), the stages it skipped come from the job it
retries, following the lineage.

The agent reads it before each stage (it replaces the envelope's own read: still one call); the
rerun and the redrive read it before anything is written, and refuse when what the skipped stages
handed on is no longer stored (HANDOFF_EXPIRED), naming the stage and the date.

A stage with shards hands on through its shards' own records (STAGE#nn#SHARD#kk): once the stage
succeeded, each shard is an earlier stage of its own here (`EarlierStage.shard`), in shard order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import ClientError

from relevo_core.aws import client, error_code
from relevo_core.models.envelope import JobEnvelope, read_envelope
from relevo_core.models.errors import ErrorCode, RelevoError
from relevo_core.models.handoff import HandoffSummary
from relevo_core.models.job_objects import JobPrefix, expected_key, manifest_key
from relevo_core.models.plan import StagePlan
from relevo_core.models.status import SUCCEEDED_STAGE
from relevo_core.store.artifacts import list_artifacts
from relevo_core.store.codec import envelope_of
from relevo_core.store.jobs import query_job_items
from relevo_core.store.keys import JOB_SK, SHARD_INFIX, is_stage_sk

# A rerun of a rerun of a rerun…: past this many earlier jobs, a skipped stage is not looked for.
MAX_LINEAGE = 8


@dataclass(frozen=True)
class EarlierStage:
    """A succeeded stage whose results a later stage gets."""

    name: str
    job_id: str
    agent_id: str | None
    handoff: HandoffSummary | None
    outputs: dict[str, str]
    # What its plan declares under `handoff:` (a succeeded stage that declares some and has no
    # summary cannot be restored from: resolved by a person without them).
    declared: tuple[str, ...] = ()
    # The shard of a stage with shards (its own record, its own values and files).
    shard: int | None = None
    # Its job's artifact_uri (the envelope's), under which its handoff manifest must be, and the
    # key (pk, sk) of the record its receipt was read from (an agent's writing).
    artifact_uri: str = ""
    record_key: tuple[str, str] = ("", "")

    def manifest_key(self) -> str:
        """The key of its handoff manifest: derived from its job's prefix, its name, shard and
        attempt, and the receipt's `manifest` must be that object (LOCATION_OUTSIDE_JOB otherwise)."""
        assert self.handoff is not None
        home = JobPrefix.of(self.artifact_uri)
        derived = manifest_key(home, self.name, self.shard, self.handoff.attempt)
        return expected_key(home, self.handoff.manifest, derived, self.record_key)

    @property
    def label(self) -> str:
        """How messages and the restore name it: `test`, or a shard's `test#shard-1` (as its
        operation id does)."""
        return self.name if self.shard is None else f"{self.name}#shard-{self.shard}"


@dataclass(frozen=True)
class JobContext:
    envelope: JobEnvelope
    # This job's stage records, by stage name.
    records: dict[str, dict[str, Any]] = field(default_factory=dict)
    # The shards' records of its stages with shards: stage name -> shard index -> record.
    shards: dict[str, dict[int, dict[str, Any]]] = field(default_factory=dict)

    @classmethod
    def of(cls, envelope: JobEnvelope, items: list[dict[str, Any]]) -> JobContext:
        """The context of `envelope` from its job's stage and shard records (any other item is
        left out)."""
        records: dict[str, dict[str, Any]] = {}
        shards: dict[str, dict[int, dict[str, Any]]] = {}
        for item in items:
            sk, name = str(item.get("sk", "")), item.get("stage_name")
            if not name or not sk.startswith("STAGE#"):
                continue
            if is_stage_sk(sk):
                records[str(name)] = item
            elif SHARD_INFIX in sk and item.get("shard_index") is not None:
                shards.setdefault(str(name), {})[int(item["shard_index"])] = item
        return cls(envelope, records, shards)

    def commit(self) -> str | None:
        """The commit the job builds: the trigger's, else the one its first checkout recorded:
        on that stage's record, or for a stage with shards on each shard's record, where every
        shard that checked out must have resolved the same one (raises RelevoError
        COMMITS_DIFFER, naming each shard's, when the ref moved between their checkouts)."""
        if self.envelope.commit:
            return self.envelope.commit
        for stage in self.envelope.stages:
            if self.records.get(stage.name, {}).get("checkout_commit"):
                return str(self.records[stage.name]["checkout_commit"])
            by_shard = {
                index: str(record["checkout_commit"])
                for index, record in sorted(self.shards.get(stage.name, {}).items())
                if record.get("checkout_commit")
            }
            if len(set(by_shard.values())) > 1:
                raise RelevoError(
                    ErrorCode.COMMITS_DIFFER,
                    f"the shards of stage {stage.name} checked out {self.envelope.ref} at different commits "
                    f"({', '.join(f'shard {index} {commit}' for index, commit in by_shard.items())}): "
                    f"the branch moved between their checkouts, so job {self.envelope.job_id} has no one "
                    "commit to build; "
                    "run it again, or name the commit",
                    stage=stage.name,
                    commits={str(index): commit for index, commit in by_shard.items()},
                )
            if by_shard:
                return next(iter(by_shard.values()))
        return None

    def stage_before(self, index: int) -> dict[str, Any] | None:
        """The record of the stage before `index`, when it ran in this job."""
        if index <= self.envelope.first_stage_index:
            return None
        return self.records.get(self.envelope.stages[index - 1].name)


def context_of(items: list[dict[str, Any]]) -> JobContext:
    record = next((item for item in items if item["sk"] == JOB_SK), None)
    if record is None:
        raise RelevoError(ErrorCode.JOB_NOT_FOUND, "no such job")
    return JobContext.of(read_envelope(envelope_of(record)), items)


def read_job_context(table: str, job_id: str) -> JobContext:
    items = query_job_items(table, job_id)
    if not items:
        raise RelevoError(ErrorCode.JOB_NOT_FOUND, f"no job {job_id!r}")
    return context_of(items)


def _earlier(
    job_id: str,
    name: str,
    record: dict[str, Any],
    declared: tuple[str, ...] = (),
    shard: int | None = None,
    artifact_uri: str = "",
) -> EarlierStage | None:
    if record.get("status") not in SUCCEEDED_STAGE:
        return None
    receipt = given if isinstance(given := record.get("receipt"), dict) else {}
    handoff = receipt.get("handoff")
    outputs = receipt.get("outputs") or {}
    return EarlierStage(
        name=name,
        job_id=job_id,
        agent_id=record.get("agent_id"),
        handoff=HandoffSummary.model_validate(handoff) if isinstance(handoff, dict) else None,
        outputs={str(k): str(v) for k, v in outputs.items()} if isinstance(outputs, dict) else {},
        declared=declared,
        shard=shard,
        artifact_uri=artifact_uri,
        record_key=(str(record.get("pk", "")), str(record.get("sk", ""))),
    )


def _earlier_of(context: JobContext, plan: StagePlan) -> list[EarlierStage]:
    """What a succeeded stage of `context`'s job left: its own record's, or once a stage with
    shards succeeded as a whole, each succeeded shard's, in shard order."""
    job_id, record, uri = (
        context.envelope.job_id,
        context.records.get(plan.name, {}),
        context.envelope.artifact_uri,
    )
    if not plan.sharded:
        earlier = _earlier(job_id, plan.name, record, plan.handoff, artifact_uri=uri)
        return [] if earlier is None else [earlier]
    if record.get("status") not in SUCCEEDED_STAGE:
        return []
    shards = context.shards.get(plan.name, {})
    found = (_earlier(job_id, plan.name, shards[index], plan.handoff, index, uri) for index in sorted(shards))
    return [earlier for earlier in found if earlier is not None]


def earlier_stages(table: str, context: JobContext, index: int) -> list[EarlierStage]:
    """The succeeded stages (and shards) before `index`, in plan order: this job's own, and for
    the stages it skipped, the lineage's. A skipped stage not found (its job deleted, or it never
    succeeded there) is left out; the rerun refused it up front."""
    envelope = context.envelope
    found: list[EarlierStage] = []
    first = envelope.first_stage_index
    skipped = [stage.name for stage in envelope.stages[: min(first, index)]]
    if skipped and envelope.retry_of:
        found += _from_lineage(table, envelope.retry_of, skipped)
    for stage in envelope.stages[first:index]:
        found += _earlier_of(context, stage)
    return found


def _from_lineage(table: str, job_id: str, names: list[str], depth: int = 0) -> list[EarlierStage]:
    try:
        context = read_job_context(table, job_id)
    except RelevoError:
        return []
    envelope = context.envelope
    ran = {stage.name for stage in envelope.stages[envelope.first_stage_index :]}
    here = {name: _earlier_of(context, envelope.stage(name)) for name in names if name in ran}
    further = [name for name in names if name not in ran]
    deeper: dict[str, list[EarlierStage]] = {}
    # At most MAX_LINEAGE jobs in all (depth counts from 0): what an agent's job credentials let
    # it read (fleet/job_credentials LINEAGE_TAGS).
    if further and envelope.retry_of and depth + 1 < MAX_LINEAGE:
        for stage in _from_lineage(table, envelope.retry_of, further, depth + 1):
            deeper.setdefault(stage.name, []).append(stage)
    ordered: list[EarlierStage] = []
    for name in names:
        ordered += here.get(name) or deeper.get(name) or []
    return ordered


def resolved_commit(table: str, job_id: str) -> str | None:
    """The commit a job built (its trigger's, or its first checkout's), for a rerun to pin."""
    try:
        context = read_job_context(table, job_id)
    except RelevoError:
        return None
    return context.commit()  # COMMITS_DIFFER refuses the rerun: it has no one commit to pin


def require_handoffs_stored(table: str, previous_job_id: str, skipped: list[str]) -> None:
    """Before a job that skips `skipped` (standing on `previous_job_id`) is written: every one of
    them that handed files on still has them stored. Refused with HANDOFF_EXPIRED otherwise,
    naming the stage and the date, so a rerun never fails halfway."""
    if not skipped:
        return
    stages = _from_lineage(table, previous_job_id, skipped)
    s3 = client("s3")
    records: dict[str, list[Any]] = {}
    for stage in stages:
        if stage.handoff is None:
            continue
        kept = records.setdefault(
            stage.job_id, [r for r in list_artifacts(table, stage.job_id) if r.kind == "handoff"]
        )
        removed = [
            r
            for r in kept
            if (r.stage, r.shard, r.attempt) == (stage.name, stage.shard, stage.handoff.attempt)
            and r.removed_at
        ]
        if removed:
            raise RelevoError(
                ErrorCode.HANDOFF_EXPIRED,
                f"stage {stage.label} of {stage.job_id} handed on files that artifact.max_total_bytes "
                "removed on "
                f"{removed[0].removed_at}: a rerun from a later stage cannot restore them; rerun from "
                f"{stage.name} or earlier",
                stage=stage.name,
                job_id=stage.job_id,
                removed_at=removed[0].removed_at,
            )
        # The manifest the stage's name gives under its job's prefix; a receipt naming another
        # object (another job's or project's) refuses the rerun, LOCATION_OUTSIDE_JOB. The key is
        # derived, and lies where this function may read (template.yaml SeeHandoffManifests): so
        # S3's 403 for it can only be its absence. Without s3:ListBucket, which this function need
        # not hold, S3 answers a missing key with 403, not 404 (Amazon S3 API Reference,
        # HeadObject, "Permissions"; botocore reports a HEAD's as "403").
        key = stage.manifest_key()
        gone = ("404", "NoSuchKey", "NotFound", "403", "Forbidden", "AccessDenied")
        try:
            s3.head_object(Bucket=JobPrefix.of(stage.artifact_uri).bucket, Key=key)
        except ClientError as exc:
            if error_code(exc) in gone:
                raise RelevoError(
                    ErrorCode.HANDOFF_EXPIRED,
                    f"stage {stage.label} of {stage.job_id} handed on files stored "
                    f"{stage.handoff.stored_at[:10]} that have expired "
                    "(the stack's ArtifactRetentionDays): a rerun from a later stage cannot restore them; "
                    f"rerun from {stage.name} or earlier",
                    stage=stage.name,
                    job_id=stage.job_id,
                    stored_at=stage.handoff.stored_at,
                ) from exc
            raise
