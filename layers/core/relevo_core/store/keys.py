"""Key layout of the single Relevo table. Every access pattern builds its keys here."""

from __future__ import annotations

from datetime import datetime

from relevo_core.models.shapes import PRIORITY_BOUND

JOB_SK = "JOB"
PROJECT_SK = "PROJECT"
DEDUP_SK = "DEDUP"
DELIVERY_SK = "DELIVERY"
COUNTER_SK = "COUNTER"
# The one item counting jobs that are queued (written, not yet started).
QUEUE_COUNTER_PK = "COUNTER#queued"
# Sparse GSI (StartPendingIndex): jobs whose execution has not yet run its first state.
START_PENDING_ATTRIBUTE = "start_pending"
START_PENDING = "pending"
START_PENDING_INDEX = "StartPendingIndex"
# On the record of a job whose intake took its project's lock: its execution runs the template's
# JobStateMachine (statemachines/job_run.asl.json), from its stages. Absent: JobQueuedStateMachine
# (statemachines/job.asl.json), which takes the lock or waits for it first.
MACHINE_ATTRIBUTE = "machine"
RUN_MACHINE = "run"
# Why a held job is held (a HeldReason value); present only while the job is held.
HELD_REASON_ATTRIBUTE = "held_reason"
# GSI over `kind` (projects, ...) sorted by pk: listings without scans.
KIND_INDEX = "KindIndex"
# Sparse GSI over `held_by`: the stage attempts an agent has claimed and not finished, with the
# journal each was claimed from (restart recovery). It replaces HeldByIndex, which did not project
# journal_id; a projection cannot change in place, and an update adds or deletes one GSI, so the
# old index stays, read by nothing, until the release after (docs/operations.md, "Upgrades").
HELD_ATTEMPTS_INDEX = "HeldAttemptsIndex"
PROJECT_KIND = "project"
# GSI over (project, created_at): a project's jobs by time, for listings and filters.
PROJECT_JOBS_INDEX = "ProjectJobsIndex"
# Set on job records only (a project's own record keeps its settings in `project`, a map).
PROJECT_JOBS_ATTRIBUTE = "project_jobs"
# Job records by status (hash) and project (range): the live jobs without the ended ones.
JOB_STATUS_INDEX = "JobStatusIndex"
LOCK_KIND = "lock"
DLQ_KIND = "dlq"
DLQ_SK = "DLQ"
LOCK_SK = "LOCK"
# Grants live in their project's partition (one Query reads the project and its grants) and
# are listed across projects through KindIndex.
GRANT_KIND = "grant"
GRANT_SK_PREFIX = "GRANT#"
# Sparse GSI (WaitOrderIndex): jobs waiting for their project's lock, hashed by project and sorted
# so that the first entry is the job that goes next (priority desc, then queue_seq asc).
WAITING_FOR_ATTRIBUTE = "waiting_for"
# The task token a job waiting for its project parked with (job.asl.json's WaitForProject);
# whoever frees the lock sends it back to wake the head of the line.
WAKE_TOKEN_ATTRIBUTE = "wake_token"
WAIT_ORDER_ATTRIBUTE = "wait_order"
WAIT_ORDER_INDEX = "WaitOrderIndex"
# Dead-letter entries by idempotency key (DeadLetterKeyIndex), and those whose freeze decision is
# still to be made (sparse FreezeCheckIndex: the state machine writes the marker with the entry).
DEAD_LETTER_KEY_INDEX = "DeadLetterKeyIndex"
FREEZE_CHECK_INDEX = "FreezeCheckIndex"
FREEZE_CHECK_ATTRIBUTE = "freeze_check"
FREEZE_CHECK_PENDING = "pending"
FREEZE_SK = "FREEZE"
# Present on a freeze record only while the key is frozen: KindIndex lists the frozen keys.
FROZEN_KEY_KIND = "frozen_key"


def job_pk(job_id: str) -> str:
    return f"JOB#{job_id}"


def stage_sk(index: int) -> str:
    # Zero-padded so stages sort in plan order under their job.
    return f"STAGE#{index:02d}"


SHARD_INFIX = "#SHARD#"


def shard_sk(index: int, shard: int) -> str:
    """A shard's attempt record, beside its stage's (which says how the stage as a whole went):
    zero-padded so the shards sort in order under their stage (at most 45 a job:
    relevo_core.plan_limits)."""
    return f"{stage_sk(index)}{SHARD_INFIX}{shard:02d}"


# A sharded stage's test plan, on its job's partition (written by the claim function only).
TEST_PLAN_SK_PREFIX = "TESTPLAN#"


def test_plan_sk(index: int) -> str:
    return f"{TEST_PLAN_SK_PREFIX}{index:02d}"


def is_stage_sk(sk: str) -> bool:
    """A stage's own record, not one of its shards' (which share its STAGE#nn prefix)."""
    return sk.startswith("STAGE#") and SHARD_INFIX not in sk


def shard_of_sk(sk: str) -> tuple[int, int] | None:
    """(stage index, shard index) of a shard's record key; None for any other key."""
    stage, infix, shard = sk.partition(SHARD_INFIX)
    if not infix or not stage.startswith("STAGE#"):
        return None
    return int(stage.removeprefix("STAGE#")), int(shard)


def attempt_sk(index: int, shard: int | None) -> str:
    """The record a stage attempt writes: its stage's, or for a stage with shards, its shard's."""
    return stage_sk(index) if shard is None else shard_sk(index, shard)


def stages_pk(job_id: str) -> str:
    # A job's stage records have a partition of their own, apart from the job record (JOB#): IAM's
    # dynamodb:LeadingKeys tells partitions apart, never items of one ("Using IAM policy conditions
    # for fine-grained access control", DynamoDB Developer Guide), so the agents that write a
    # stage's attempt can be given its stages' partition and never the job record's status,
    # envelope or outcome. Stacks deployed before it keep old jobs' stages under JOB# (store/job_purge).
    return f"STAGES#{job_id}"


def stage_key(job_id: str, index: int, shard: int | None = None) -> dict[str, dict[str, str]]:
    return key(stages_pk(job_id), attempt_sk(index, shard))


def tokens_pk(job_id: str) -> str:
    # A job's task tokens (its approval gate's, each attempt's run token, each review's) have a
    # partition of their own that no job session may read: a token is a capability (whoever holds
    # it answers the task, and SendTask* take no resource, so IAM cannot scope them), and
    # dynamodb:LeadingKeys scopes partitions, never attributes of an item another grant reads
    # (docs/architecture.md, "Trust boundaries"). Written by the state machine only.
    return f"TOKENS#{job_id}"


# The job's approval gate (one at a time: a later gate's overwrites an earlier, answered one).
APPROVAL_TOKEN_SK = "APPROVAL"
RUN_TOKEN_PREFIX = "RUN#"
REVIEW_TOKEN_PREFIX = "REVIEW#"


def run_token_sk(index: int, shard: int | None = None) -> str:
    """The run token of a stage's (or shard's) current attempt: AwaitResult writes it."""
    return f"{RUN_TOKEN_PREFIX}{attempt_sk(index, shard)}"


def review_token_sk(index: int, shard: int | None = None) -> str:
    """The token of a stage (or shard) waiting in manual review: AwaitManualReview writes it."""
    return f"{REVIEW_TOKEN_PREFIX}{attempt_sk(index, shard)}"


def project_pk(project_id: str) -> str:
    return f"PROJECT#{project_id}"


def grant_sk(principal: str) -> str:
    return f"{GRANT_SK_PREFIX}{principal}"


def audit_pk(job_id: str) -> str:
    return f"AUDIT#{job_id}"


def dlq_pk(job_id: str) -> str:
    return f"DLQ#{job_id}"


def lock_pk(project_id: str) -> str:
    return f"LOCK#{project_id}"


def agents_pk(region: str) -> str:
    # All presence records of one region share a partition: "who is online in eu-west" is one query.
    return f"AGENTS#{region}"


def agent_sk(agent_id: str) -> str:
    return f"AGENT#{agent_id}"


def pauses_pk(region: str) -> str:
    # A region's pauses have a partition of their own, apart from presence: the agent role may
    # write its region's presence partition but only read this one, so an agent cannot pause or
    # resume another. IAM's dynamodb:LeadingKeys matches partition key values only ("Using IAM
    # policy conditions for fine-grained access control", DynamoDB Developer Guide).
    return f"PAUSES#{region}"


# One pause item per paused agent (PAUSE#id), and one for the region's dispatch (PAUSE);
# begins_with "PAUSE" reads them all.
PAUSE_SK_PREFIX = "PAUSE#"
DISPATCH_PAUSE_SK = "PAUSE"
# The region's own record in that partition: whether any of its agents was online at the last
# change the sweeper saw (relevo_core.store.region_online). No presence or pause key has it.
REGION_ONLINE_SK = "ONLINE_AGENTS"


def pause_sk(agent_id: str) -> str:
    return f"{PAUSE_SK_PREFIX}{agent_id}"


def freeze_pk(idempotency_key: str) -> str:
    return f"FREEZE#{idempotency_key}"


def queue_seq(created_at: datetime) -> int:
    """A job's place in arrival order: its enqueue time in microseconds since the epoch.

    Time-based so that intake needs no extra call (a counter would be one more round trip, as
    TransactWriteItems returns no values); ties and clock skew between containers are broken by
    the job id in `wait_order`.
    """
    return int(created_at.timestamp() * 1_000_000)


def wait_order(priority: int, seq: int, job_id: str) -> str:
    """Sort key of a waiting job: higher priority first, then earlier queue_seq, then job id.

    Derived only from the job record's priority and queue_seq, so a priority change re-orders a
    queued job by rewriting this one attribute.
    """
    return f"{PRIORITY_BOUND - priority:07d}#{seq:017d}#{job_id}"


def dedup_pk(idempotency_key: str) -> str:
    return f"DEDUP#{idempotency_key}"


def delivery_pk(source: str, delivery_id: str) -> str:
    return f"DELIVERY#{source}#{delivery_id}"


# A project's running artifact total (artifact.max_total_bytes), and under the same partition one
# marker per table-stream record already counted into it (a redelivered record adds nothing).
ARTIFACT_USAGE_SK = "ARTIFACTS"
COUNTED_SK_PREFIX = "COUNTED#"


def usage_pk(project_id: str) -> str:
    return f"USAGE#{project_id}"


# A project's build numbers (store.build_numbers): the last one given, on one counter item in a
# partition of its own, apart from the queue's COUNTER# (a project may be named anything), so that
# IAM's dynamodb:LeadingKeys can give the claim function this item's write and nothing else's.
BUILD_NUMBER_SK = "LAST"
# On a job record: the number the job took (or carried over from the job it reruns).
BUILD_NUMBER_ATTRIBUTE = "build_number"


def build_numbers_pk(project_id: str) -> str:
    return f"BUILDNUMBERS#{project_id}"


def key(pk: str, sk: str) -> dict[str, dict[str, str]]:
    return {"pk": {"S": pk}, "sk": {"S": sk}}


def log_partition(job_id: str, stage_index: int | None = None, shard: int | None = None) -> str:
    """What follows `LOGS#` in a log partition's key: the job's own log (stages without shards), or
    one shard's, `<job>/<stage:02d>/<shard:02d>`. Each shard writes a partition of its own, with its
    own seq: one partition takes at most 1,000 write units a second, a transaction's write costing
    two ("Best practices for designing and using partition keys effectively", DynamoDB Developer
    Guide), and shards sharing one seq collided and retried. The job session's `log` tag carries
    this name (IAM's dynamodb:LeadingKeys grants that partition only, relevo_core.fleet.job_credentials):
    a tag value allows no `#`, hence `/`, which no job id has (models/shapes.JOB_ID)."""
    return job_id if shard is None else f"{job_id}/{stage_index:02d}/{shard:02d}"


def log_pk(job_id: str, stage_index: int | None = None, shard: int | None = None) -> str:
    # Log chunks live under their own partition: reading a job never pages through its output.
    return f"LOGS#{log_partition(job_id, stage_index, shard)}"


def log_sk(seq: int) -> str:
    # Zero-padded so chunks sort by seq.
    return f"SEQ#{seq:012d}"


def artifact_pk(job_id: str) -> str:
    return f"ARTIFACTS#{job_id}"


def artifact_sk(stage: str, path: str, shard: int | None = None) -> str:
    """A stage's file, or a shard's: each shard's files are its own (as their objects are,
    under `<stage>/shard-<k>/`), so two shards leaving one name never share a record."""
    return f"{stage}#{path}" if shard is None else f"{stage}#shard-{shard}/{path}"


# Once-per-transition markers of the status reporter and notifier (store.notices): one item per
# job and target/transition, so a redelivered stream record finds its marker and sends nothing.
NOTICE_SK_PREFIX = "NOTICE#"
# "Only on change" windows (e.g. agents_offline per region and group) live in their own partition.
SUPPRESSION_SK = "SUPPRESS"
# Delivery records (store.deliveries): outgoing statuses and notifications and incoming webhook
# deliveries, newest last under their project's partition.
DELIVERY_LOG_SK_PREFIX = "AT#"
GROUP_SK = "GROUP"
GROUP_KIND = "group"


def notice_pk(subject: str) -> str:
    # A job id, or what else a notice is about (a frozen key: key_frozen#<key>).
    return f"NOTICES#{subject}"


def notice_sk(target: str, transition: str) -> str:
    return f"{NOTICE_SK_PREFIX}{target}#{transition}"


# The newest transition of a job delivered to each commit-status target (store.latest_reports),
# beside the job's markers: a report older than it is superseded, never sent over it.
LATEST_REPORT_SK_PREFIX = "LATEST#"


def latest_report_sk(target: str) -> str:
    return f"{LATEST_REPORT_SK_PREFIX}{target}"


def suppression_pk(subject: str) -> str:
    return f"SUPPRESS#{subject}"


def delivery_log_pk(project_id: str) -> str:
    return f"DELIVERIES#{project_id}"


def delivery_log_sk(at: str, tail: str) -> str:
    """`at` (ISO 8601, UTC) sorts the partition; `tail` keeps apart two records of one instant."""
    return f"{DELIVERY_LOG_SK_PREFIX}{at}#{tail}"


# The tail of the one record of refused webhook deliveries a project gets per minute: its sort key
# is the minute's own, so a second refusal of that minute finds it taken.
REFUSED_MINUTE_TAIL = "refused"


def minute_of(moment: datetime) -> datetime:
    """The start of `moment`'s minute: a project's refused deliveries of one minute share a record."""
    return moment.replace(second=0, microsecond=0)


def refused_minute_sk(moment: datetime) -> str:
    """The sort key of the record of the project's refusals of `moment`'s minute."""
    return delivery_log_sk(minute_of(moment).isoformat(timespec="milliseconds"), REFUSED_MINUTE_TAIL)


def group_pk(group: str) -> str:
    return f"GROUP#{group}"


def cache_pk(scope: str) -> str:
    """A project's caches in one region (scope `<project>/<region>`): every entry one partition,
    so "the newest entry whose key starts with this prefix" is one Query (store.cache_entries)."""
    return f"CACHE#{scope}"


def cache_entry_sk(cache_key: str) -> str:
    return f"KEY#{cache_key}"
