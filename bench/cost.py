"""Cost of one four-stage job: state transitions, DynamoDB units, SQS requests, Lambda, in dollars.

    .venv/bin/python bench/cost.py

Starts the embedded stack (moto + template.yaml), registers a four-stage project, and runs ONE job
end to end: a signed GitHub push goes through functions/webhook/handler.py *in this process*
(relevo_core.intake.webhooks.receive.receive underneath, as bench/intake.py calls it), then an agent
double in this process takes each stage the way relevo-agent does: receive; claim through the
claim function (functions/agent_sessions/handler.py, in this process, as its own role), which
answers the dispatch and answers with the envelope and the job's session; then with that session
wait for the run token, record and report; delete the message with its own credentials. Until the execution
SUCCEEDED.

Every AWS API call made in this process is recorded by wrapping botocore's
Endpoint.make_request. Calls of the main thread are charged to the phase running (webhook, agent,
sweeper; the bench's own observing calls are not charged); calls of other threads are the
Step Functions interpreter (moto runs it in this process) when they name this job or project.

Request units are computed from the DynamoDB rules with item sizes measured at the end of the run
(attribute names + values, DynamoDB's size rules), including the writes each GSI takes.

Prints the measured counts, a dollar table per 1,000 jobs at us-east-1 list prices, what a running
stage costs a minute (its lease renewals and its heartbeats through the heartbeat route, at the
default lease and at this job's, against the heartbeat with every renewal as before), what each
addition of the last rounds costs a job (the outcome route, the run tokens' records), and the
fixed monthly costs (sweeper tick, idle agent polling). Exits 1 when the transition budget (3 per stage
+ 2 per job on the success path) or the dollar budget is exceeded, 2 when the bench itself broke, 0 otherwise.
"""

from __future__ import annotations

import json
import math
import secrets
import sys
import threading
import time
import traceback
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402  (the repository root is on the path first)

STAGES = [
    {"name": "build", "run": "true"},
    {"name": "test", "run": "true"},
    {"name": "sign", "run": "true"},
    {"name": "upload", "run": "true"},
]
REGION = "eu-west"  # the project's region_affinity (bench/harness.py register_project)
AGENT_ID = "cost-double-1"

# The success path of the generated machine (issue 31): per stage MarkStageDispatched > DispatchStage
# > AwaitResult, per job RunStages > ReleaseLockAndMarkSucceeded: intake took the project's lock
# with the job, whose execution runs job_run.asl.json from its stages (issue 47). A job that had
# to queue for its project runs job.asl.json, one more: AcquireProjectLockAndStart first.
TRANSITIONS_PER_STAGE_BUDGET = 3
TRANSITIONS_PER_JOB_BUDGET = 2
# A stage with shards (issue 32) on its success path: each shard the 3 of a stage
# (ShardMarkStageDispatched > ShardDispatchStage > ShardAwaitResult), and the fan-out 7
# (MarkStageDispatched refused > GatedOrSharded > StartShards > RunShards > AnyShardFailed >
# RecordShardsSucceeded > ShardsSucceeded): 3 × shards + 7 for the stage (a shard that ended
# `warning` adds ShardsWarned: 8; a shard a redrive carried over as succeeded costs 2,
# ShardMarkStageDispatched refused > ShardClosedBeforeDispatch). Held by
# tests/integration/test_parallel_stages.py; this bench's job has no stage with shards.
TRANSITIONS_PER_SHARD_BUDGET = 3
TRANSITIONS_PER_FAN_OUT_BUDGET = 7
# Dollars per 1,000 jobs of STAGES on the success path (issue 47: with the outcome route and the
# records of the last rounds, transitions counted as before).
DOLLARS_PER_1000_JOBS = 0.45

# us-east-1 list prices: the same numbers price a job's cost in the API (GET /jobs/{id}/cost).
from relevo_core.jobs.cost import (  # noqa: E402
    DDB_PER_RRU,
    DDB_PER_WRU,
    LAMBDA_PER_GB_S,
    LAMBDA_PER_REQUEST,
    SFN_PER_TRANSITION,
    SQS_PER_REQUEST,
)

WEBHOOK_MEMORY_GB = 512 / 1024
MINUTES_PER_MONTH = 60 * 24 * 30
IDLE_RECEIVES_PER_MIN = 3  # assumption: one agent long-polling with WaitTimeSeconds=20

SOURCES = ("webhook", "claim", "agent", "state_machine")
CLAIM_MEMORY_GB = 512 / 1024
API_GATEWAY_PER_REQUEST = 3.50 / 1_000_000  # REST API, first 333 million requests a month


# ------------------------------------------------------------------------------------------------
# Recording every AWS call of this process


@dataclass
class Call:
    source: str  # webhook, agent, state_machine, sweeper, warmup, bench (not charged), other
    service: str
    op: str
    params: dict[str, Any]
    response: dict[str, Any]
    ok: bool
    thread: str


_PHASE: ContextVar[str | None] = ContextVar("bench_phase", default=None)


class Recorder:
    """Global Endpoint.make_request wrapper. Calls of the main thread, and of the threads it hands
    work to in its context (relevo_core.aws.in_this_context: the claim function's side-by-side
    reads), go to the current phase; calls of other threads (moto's Step Functions interpreter)
    to `state_machine` when they name the job."""

    def __init__(self) -> None:
        self.main = threading.get_ident()
        self.phase = "bench"
        self.markers: tuple[str, ...] = ()
        self.calls: list[Call] = []
        self._lock = threading.Lock()

    @property
    def phase(self) -> str:
        return str(_PHASE.get())

    @phase.setter
    def phase(self, value: str) -> None:
        _PHASE.set(value)

    def install(self) -> None:
        harness.record_aws_calls(self.record)

    def record(self, operation_model: Any, request_dict: dict[str, Any], result: Any) -> None:
        body = request_dict.get("body")
        text = body.decode("utf-8", "replace") if isinstance(body, bytes) else json.dumps(body, default=str)
        try:
            params = json.loads(text) if text and text.startswith("{") else {}
        except json.JSONDecodeError:
            params = {}
        _, parsed = result
        if _PHASE.get() is not None:
            source = str(_PHASE.get())
        elif self.markers and any(marker in text for marker in self.markers):
            source = "state_machine"
        else:
            source = "other"
        call = Call(
            source=source,
            service=operation_model.service_model.service_name,
            op=operation_model.name,
            params=params,
            response=parsed if isinstance(parsed, dict) else {},
            ok=not (isinstance(parsed, dict) and "Error" in parsed),
            thread=threading.current_thread().name,
        )
        with self._lock:
            self.calls.append(call)

    def of(self, source: str, service: str | None = None) -> list[Call]:
        with self._lock:
            return [c for c in self.calls if c.source == source and (service is None or c.service == service)]


# ------------------------------------------------------------------------------------------------
# Lambda duration: what the function does, not how fast the emulator answers

# Each AWS call a function makes, priced at its latency on AWS from inside the region (the table of
# bench/critical_path.py, with its sources); a service that table has no row for at its assumption
# for a regional call. The emulator's own answer time on this host is never priced.
from bench.critical_path import LATENCY_MS  # noqa: E402

AWS_CALL_SEC: dict[str, float] = {
    "dynamodb": LATENCY_MS["dynamodb"][0] / 1000,
    "stepfunctions": LATENCY_MS["states"][0] / 1000,
    "sts": LATENCY_MS["sts"][0] / 1000,
    "sqs": LATENCY_MS["sqs"][0] / 1000,
}
OTHER_CALL_SEC = 0.020  # assumed, as sts and sqs above: a regional call from inside the region
LAMBDA_BILLING_GRANULARITY_SEC = 0.001  # "AWS Lambda pricing": duration rounded up to the nearest 1 ms


def call_sec(service: str) -> float:
    return AWS_CALL_SEC.get(service, OTHER_CALL_SEC)


@dataclass
class Invocation:
    """One function invocation as Lambda would bill it: the CPU of its handler thread and of the
    side-by-side threads it hands work to (its code,
    botocore's serializing and parsing included) and its AWS calls at their latency on AWS. Calls
    of the handler thread wait one after another; calls of threads it hands work to (relevo_core's
    side-by-side reads) wait beside each other, so they cost the slowest of them once."""

    phase: str
    cpu_sec: float
    calls: list[Call]
    handler_thread: str
    wall_sec: float  # the emulator's figure on this host: printed as such, never priced

    @property
    def aws_sec(self) -> float:
        own = sum(call_sec(c.service) for c in self.calls if c.thread == self.handler_thread)
        beside = [call_sec(c.service) for c in self.calls if c.thread != self.handler_thread]
        return own + max(beside, default=0.0)

    @property
    def billed_sec(self) -> float:
        ms = math.ceil(round((self.cpu_sec + self.aws_sec) * 1000, 6))
        return max(1, ms) * LAMBDA_BILLING_GRANULARITY_SEC


class MeasuredPool(ThreadPoolExecutor):
    """relevo_core.aws's side-by-side pool, counting the CPU time its threads spend on the tasks
    they run: a function's work done there (the claim's reads, its job session) is billed as its
    handler thread's is, and time.thread_time of the handler thread does not see it."""

    def __init__(self) -> None:
        super().__init__(max_workers=8, thread_name_prefix="side-by-side")
        self._cpu_lock = threading.Lock()
        self.cpu_sec = 0.0

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        def measured() -> Any:
            began = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                spent = time.thread_time() - began
                with self._cpu_lock:
                    self.cpu_sec += spent

        return super().submit(measured)


class Meter:
    """Runs a handler in-process as `phase` and returns what Lambda would bill for it: the CPU of
    its handler thread, and of the side-by-side pool's threads while it runs (`pool`)."""

    def __init__(
        self, recorder: Recorder, cpu_clock: Any = time.thread_time, pool: MeasuredPool | None = None
    ) -> None:
        self.recorder = recorder
        self.cpu_clock = cpu_clock
        self.pool = pool

    def run(self, phase: str, handler: Any) -> tuple[Any, Invocation]:
        before = self.recorder.phase
        self.recorder.phase = phase
        with self.recorder._lock:
            first = len(self.recorder.calls)
        pool_cpu = self.pool.cpu_sec if self.pool is not None else 0.0
        cpu, wall = self.cpu_clock(), time.perf_counter()
        try:
            result = handler()
        finally:
            cpu, wall = self.cpu_clock() - cpu, time.perf_counter() - wall
            if self.pool is not None:
                cpu += self.pool.cpu_sec - pool_cpu
            self.recorder.phase = before
        with self.recorder._lock:
            calls = [c for c in self.recorder.calls[first:] if c.source == phase]
        return result, Invocation(phase, cpu, calls, threading.current_thread().name, wall)


# ------------------------------------------------------------------------------------------------
# DynamoDB sizes and request units


def _number_size(text: str) -> int:
    digits = text.lstrip("-").replace(".", "").lstrip("0").rstrip("0") or "0"
    return (len(digits) + 1) // 2 + 1 + (1 if text.startswith("-") else 0)


def value_size(value: dict[str, Any]) -> int:
    ((kind, raw),) = value.items()
    if kind == "S":
        return len(raw.encode())
    if kind == "N":
        return _number_size(raw)
    if kind == "B":
        return len(raw)
    if kind in ("BOOL", "NULL"):
        return 1
    if kind == "SS":
        return sum(len(s.encode()) for s in raw)
    if kind == "NS":
        return sum(_number_size(n) for n in raw)
    if kind == "BS":
        return sum(len(b) for b in raw)
    if kind == "L":
        return 3 + sum(1 + value_size(v) for v in raw)
    if kind == "M":
        return 3 + sum(1 + len(k.encode()) + value_size(v) for k, v in raw.items())
    raise ValueError(kind)


def item_size(item: dict[str, Any]) -> int:
    return sum(len(name.encode()) + value_size(value) for name, value in item.items())


def _key_of(attrs: dict[str, Any]) -> tuple[str, str]:
    return attrs["pk"]["S"], attrs["sk"]["S"]


# Keys of items carrying `kind` (so projected into KindIndex), filled once sizes are measured.
kind_items: set[tuple[str, str]] = set()
# Keys of items carrying `project_jobs` (the job record: in ProjectJobsIndex and, by its `status`,
# JobStatusIndex, both ProjectionType ALL in template.yaml), filled once sizes are measured.
job_index_items: set[tuple[str, str]] = set()


@dataclass
class Units:
    wru: float = 0.0
    gsi_wru: float = 0.0
    rru: float = 0.0
    writes: int = 0
    reads: int = 0


def written_keys(call: Call) -> list[tuple[tuple[str, str], bool, str]]:
    """(key, transactional, request text) for each item a write call touches."""
    p = call.params
    if call.op in ("PutItem",):
        return [(_key_of(p["Item"]), False, json.dumps(p))]
    if call.op in ("UpdateItem", "DeleteItem"):
        return [(_key_of(p["Key"]), False, json.dumps(p))]
    if call.op == "TransactWriteItems":
        out = []
        for entry in p["TransactItems"]:
            ((kind, body),) = entry.items()
            out.append((_key_of(body["Item"] if kind == "Put" else body["Key"]), True, json.dumps(body)))
        return out
    if call.op == "BatchWriteItem":
        out = []
        for requests in p["RequestItems"].values():
            for request in requests:
                body = request.get("PutRequest", {}).get("Item") or request["DeleteRequest"]["Key"]
                out.append((_key_of(body), False, json.dumps(request)))
        return out
    return []


def units_of(calls: list[Call], sizes: dict[tuple[str, str], int]) -> tuple[Units, list[str]]:
    """WRU/RRU of these DynamoDB calls by DynamoDB's rules, item sizes measured at the end."""
    units = Units()
    notes: list[str] = []
    for call in calls:
        if call.service != "dynamodb":
            continue
        keys = written_keys(call)
        if keys:
            units.writes += 1
            for key, transactional, text in keys:
                size = sizes.get(key, 1)
                wru = math.ceil(max(size, 1) / 1024) * (2 if transactional else 1)
                units.wru += wru
                # GSIs: KindIndex projects ALL of every item with `kind` (locks, projects), so each
                # write of such an item is a write there too; StartPendingIndex holds a small entry
                # (keys + job_id) from the job's Put until MarkStarted REMOVEs it.
                if key in kind_items:
                    units.gsi_wru += math.ceil(max(size, 1) / 1024)
                # The job record: a write in ProjectJobsIndex and one in JobStatusIndex each time, and
                # a second in JobStatusIndex (the old entry's delete) when the write changes `status`,
                # its hash key ("Global secondary indexes: provisioned throughput considerations").
                if key in job_index_items:
                    per_index = math.ceil(max(size, 1) / 1024)
                    changes_status = "UpdateExpression" in text and "#status = " in text
                    units.gsi_wru += per_index * (3 if changes_status else 2)
                if "start_pending" in text:
                    units.gsi_wru += 1
            continue
        if call.op == "GetItem":
            units.reads += 1
            size = sizes.get(_key_of(call.params["Key"]), 1)
            units.rru += math.ceil(max(size, 1) / 4096) * (1 if call.params.get("ConsistentRead") else 0.5)
        elif call.op in ("Query", "Scan"):
            units.reads += 1
            total = sum(item_size(item) for item in call.response.get("Items", []))
            strong = call.params.get("ConsistentRead") and not call.params.get("IndexName")
            units.rru += math.ceil(max(total, 1) / 4096) * (1 if strong else 0.5)
        elif call.op in ("DescribeTable",):
            pass  # control plane: free
        else:
            notes.append(f"unpriced DynamoDB operation {call.op}")
    return units, notes


@dataclass(frozen=True)
class ItemWrites:
    """The writes of one item of the job's path: which item (its key with ids left out), how it
    was written, its size and the units they took."""

    item: str
    how: str  # the operation, and whether inside a transaction (2 WRU a KB instead of 1)
    writes: int
    size: int
    wru: int


def item_label(key: tuple[str, str]) -> str:
    """An item's key with its ids and numbers as `*` (a part of letters only is kept): JOB#*/JOB,
    STAGES#*/STAGE#*, COUNTER#queued/COUNTER: the items of every stage under one label."""
    return "/".join("#".join(p if p.isalpha() else "*" for p in part.split("#")) for part in key)


def writes_by_item(calls: list[Call], sizes: dict[tuple[str, str], int]) -> list[ItemWrites]:
    """Each item's writes among these calls, grouped by item and operation, the most units first:
    which writes of the job's path cost most, and why (an item's size rounded up to 1 KB, and
    doubled in a transaction: "DynamoDB read and write operations", Capacity unit consumption
    for write operations, DynamoDB Developer Guide; an UpdateItem is charged the larger of the
    item before and after it, so the whole item, not the attributes it sets)."""
    grouped: dict[tuple[str, str], list[int]] = {}
    item_sizes: dict[str, int] = {}
    for call in calls:
        if call.service != "dynamodb":
            continue
        for key, transactional, _ in written_keys(call):
            size = sizes.get(key, 1)
            label = item_label(key)
            item_sizes[label] = max(item_sizes.get(label, 0), size)
            how = f"{call.op}" if not transactional else f"TransactWriteItems ({_entry_kind(call, key)})"
            grouped.setdefault((label, how), []).append(
                math.ceil(max(size, 1) / 1024) * (2 if transactional else 1)
            )
    rows = [
        ItemWrites(label, how, len(units), item_sizes[label], sum(units))
        for (label, how), units in grouped.items()
    ]
    return sorted(rows, key=lambda row: (-row.wru, row.item, row.how))


def _entry_kind(call: Call, key: tuple[str, str]) -> str:
    for entry in call.params.get("TransactItems", []):
        ((kind, body),) = entry.items()
        if _key_of(body["Item"] if kind == "Put" else body["Key"]) == key:
            return str(kind)
    return "?"


# ------------------------------------------------------------------------------------------------
# The run


def run(recorder: Recorder) -> int:
    with harness.local_stack(prefix="relevo-cost-") as info:
        return measure(info, recorder)


def measure(stack: Any, recorder: Recorder) -> int:
    from relevo_core.aws import client

    function, _ = harness.use_function_environment(stack, "WebhookFunction")
    memory_gb = int(function.get("MemorySize", 512)) / 1024

    from relevo_core.config import intake_settings
    from relevo_core.execution import work_queue_url
    from relevo_core.models.envelope import read_envelope
    from relevo_core.store import stage_attempts

    project_id = "cost-" + secrets.token_hex(3)
    secret = harness.register_project(stack, project_id, STAGES)
    repo = f"acme/{project_id}"

    handler = harness.cold_handler("webhook")
    settings = intake_settings()
    recorder.install()
    # The pool a claim function's reads run on, measured (its threads' CPU is the function's).
    import relevo_core.aws

    pool = MeasuredPool()
    relevo_core.aws._SIDE_BY_SIDE = pool
    meter = Meter(recorder, pool=pool)

    def invoke(phase: str, event_name: str, body: bytes) -> tuple[dict[str, Any], Invocation]:
        event = harness.webhook_event(
            project_id, harness.github_headers(secret, body, event=event_name), body
        )
        return meter.run(phase, lambda: handler.lambda_handler(event, harness.LambdaContext()))

    # Warm the container first (project, secret, queue URL): at volume a job lands on a warm
    # container. These reads are shown as cold-container extras, not charged per job.
    pong, _ = invoke(
        "warmup", "ping", json.dumps({"zen": "Keep it logically awesome.", "hook_id": 1}).encode()
    )
    assert pong["statusCode"] == 200, pong
    recorder.phase = "warmup"
    work_queue_url(settings.work_queue_prefix, REGION)
    recorder.phase = "bench"

    # (a) the webhook: one signed push, in-process.
    response, webhook = invoke("webhook", "push", harness.push_body(repo, secrets.token_hex(20)))
    assert response["statusCode"] == 202, response
    job_id = json.loads(response["body"])["job_id"]
    recorder.markers = (job_id, f"LOCK#{project_id}")
    print(
        f"job {job_id} accepted: {webhook.billed_sec * 1000:.0f} ms priced ({webhook.cpu_sec * 1000:.1f} ms"
        f" CPU + {len(webhook.calls)} AWS calls); {webhook.wall_sec * 1000:.1f} ms against the emulator"
    )

    # (b) the agent double, one stage message at a time.
    from relevo_agent.claim import new_claim_secret
    from relevo_agent.claim_routes import session_credentials
    from relevo_core.aws import JobCredentials, job_scope
    from relevo_core.models.agent_session import ClaimGranted

    claim_role = client("iam").get_role(RoleName=stack.resources["AgentSessionsRole"])["Role"]["Arn"]
    harness.use_function_environment(stack, "AgentSessionsFunction")
    with harness.as_role(claim_role, warm=True):
        claims = harness.cold_handler("agent_sessions")
    sqs = client("sqs")
    queue_url = stack.work_queues[REGION]
    empty_receives = 0
    routes: list[Invocation] = []  # each stage's claim, then its outcome
    for index, stage in enumerate(STAGES):
        recorder.phase = "agent"
        deadline = time.monotonic() + 30
        message = None
        while message is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no message for stage {stage['name']}")
            got = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=1, WaitTimeSeconds=1).get(
                "Messages", []
            )
            if not got:
                empty_receives += 1
                continue
            message = got[0]
        task = json.loads(message["Body"])
        assert (task["job_id"], task["stage"], task["stage_index"]) == (job_id, stage["name"], index), task
        # The claim, through the claim function as its own role (an API Gateway request and a
        # Lambda invocation per claim, charged below).
        request = {
            "job_id": job_id,
            "stage_index": index,
            "attempt": task["attempt"],
            "agent_id": AGENT_ID,
            "claim_secret": new_claim_secret(),
            "dispatch_key": task["dispatch_key"],
            "dispatch_token": task["task_token"],
        }
        claim_event = harness.claim_event(
            REGION, request, f"arn:aws:sts::123456789012:assumed-role/agent/{AGENT_ID}"
        )
        with harness.as_role(claim_role, warm=True):
            answer, invocation = meter.run(
                "claim", lambda event=claim_event: claims.lambda_handler(event, harness.LambdaContext())
            )
            routes.append(invocation)
        assert answer["statusCode"] == 200, answer
        granted = ClaimGranted.model_validate_json(answer["body"])
        envelope = read_envelope(granted.envelope)
        ref = stage_attempts.StageRef(
            stack.table_name, task["job_id"], task["stage_index"], task["attempt"], AGENT_ID
        )
        assert granted.accepted is True, granted.accepted  # the claim function answered the dispatch
        with job_scope(JobCredentials(session_credentials(granted.session))):
            wait_for_run_handed(ref)
        # A zero-length stage: no lease renewal or heartbeat falls due (see the rate printed below).
        # Its outcome goes through the outcome route, which records it and answers the run token
        # (an API Gateway request and a Lambda invocation per stage, charged below).
        outcome = {
            key: request[key] for key in ("job_id", "stage_index", "attempt", "agent_id", "claim_secret")
        }
        outcome_event = harness.claim_event(
            REGION,
            {**outcome, "status": "succeeded", "outcome": "succeeded", "exit_code": 0},
            f"arn:aws:sts::123456789012:assumed-role/agent/{AGENT_ID}",
            route="outcomes",
        )
        with harness.as_role(claim_role, warm=True):
            answer, invocation = meter.run(
                "claim", lambda event=outcome_event: claims.lambda_handler(event, harness.LambdaContext())
            )
            routes.append(invocation)
        recorder.phase = "agent"
        assert answer["statusCode"] == 200, answer
        sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"])
        recorder.phase = "bench"

    described = wait_for_execution(stack.state_machine_arn, job_id, timeout=60)
    if described["status"] != "SUCCEEDED":
        raise RuntimeError(
            f"execution ended {described['status']}: {described.get('error')} {described.get('cause')}"
        )
    time.sleep(0.5)  # the last state's write has been answered; let stray threads settle
    events = execution_history(stack.state_machine_arn, job_id)

    # (c) the sweeper, one idle tick in-process (fixed cost, not per job).
    from relevo_core.recovery.sweeper import sweep

    _, sweeper = meter.run("sweeper", lambda: sweep(settings, datetime.now(UTC)))

    # Item sizes at the end (the largest each item got: updates here only add attributes).
    sizes: dict[tuple[str, str], int] = {}
    envelope_json = packed_envelope = unpacked_job_item = 0
    touched = {
        key
        for call in recorder.calls
        if call.service == "dynamodb" and call.source in (*SOURCES, "warmup", "sweeper")
        for key, _, _ in written_keys(call)
    } | {
        _key_of(call.params["Key"])
        for call in recorder.calls
        if call.service == "dynamodb"
        and call.op == "GetItem"
        and call.source in (*SOURCES, "warmup", "sweeper")
    }
    ddb = client("dynamodb")
    for key in sorted(touched):
        item = ddb.get_item(
            TableName=stack.table_name, Key={"pk": {"S": key[0]}, "sk": {"S": key[1]}}, ConsistentRead=True
        ).get("Item")
        if item:
            sizes[key] = item_size(item)
            if "kind" in item:
                kind_items.add(key)
            if "project_jobs" in item:
                job_index_items.add(key)
            if key == (f"JOB#{job_id}", "JOB"):
                from relevo_core.store.codec import (
                    PACKED_ENVELOPE,
                    envelope_of,
                    from_attributes,
                    to_attributes,
                )

                envelope_json = len(json.dumps(envelope_of(from_attributes(item)), default=_json_default))
                packed_envelope = len(item[PACKED_ENVELOPE]["S"]) if PACKED_ENVELOPE in item else 0
                # The same record with its envelope as the map it was stored as before it was packed.
                unpacked_job_item = item_size(
                    {k: v for k, v in item.items() if k != PACKED_ENVELOPE}
                    | to_attributes({"envelope": envelope_of(from_attributes(item))})
                )

    return report(
        recorder,
        events,
        sizes,
        (envelope_json, packed_envelope, unpacked_job_item),
        job_id,
        webhook,
        memory_gb,
        sweeper,
        empty_receives,
        envelope,
        routes,
    )


def poll(read: Any, timeout: float, what: str, interval: float) -> Any:
    """`read()` again every `interval` seconds until it returns something truthy, which is returned."""
    deadline = time.monotonic() + timeout
    while not (value := read()):
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(interval)
    return value


def wait_for_run_handed(ref: Any) -> None:
    """The state machine has handed the holder of the attempt its run token once it saw the claim
    (the stage record says so; the token itself is the outcome route's to use)."""
    from relevo_core.store import stage_claims

    poll(lambda: stage_claims.run_handed(ref) or None, 10, "no run token handed", 0.05)


def wait_for_execution(state_machine_arn: str, job_id: str, timeout: float) -> dict[str, Any]:
    from relevo_core.aws import client
    from relevo_core.execution import execution_arn

    def ended() -> dict[str, Any] | None:
        described = client("stepfunctions").describe_execution(
            executionArn=execution_arn(state_machine_arn, job_id)
        )
        return None if described["status"] == "RUNNING" else described

    return dict(poll(ended, timeout, f"execution {job_id} still RUNNING", 0.1))


def execution_history(state_machine_arn: str, job_id: str) -> list[dict[str, Any]]:
    from relevo_core.aws import client
    from relevo_core.execution import execution_arn

    pages = (
        client("stepfunctions")
        .get_paginator("get_execution_history")
        .paginate(executionArn=execution_arn(state_machine_arn, job_id))
    )
    return [event for page in pages for event in page["events"]]


def _json_default(value: Any) -> Any:
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    return str(value)


# ------------------------------------------------------------------------------------------------
# Report


def stage_start_state() -> str:
    definition = json.loads((ROOT / "statemachines" / "job_run.asl.json").read_text())
    return definition["States"]["RunStages"]["ItemProcessor"]["StartAt"]


def stage_state_names() -> set[str]:
    definition = json.loads((ROOT / "statemachines" / "job_run.asl.json").read_text())
    names: set[str] = set()

    def walk(states: dict[str, Any], inside_map: bool) -> None:
        for name, state in states.items():
            if inside_map:
                names.add(name)
            if state["Type"] == "Map":
                walk((state.get("ItemProcessor") or state["Iterator"])["States"], True)

    walk(definition["States"], False)
    return names


def ops(calls: list[Call]) -> str:
    counted = Counter(f"{c.service}:{c.op}" + ("" if c.ok else "(failed)") for c in calls)
    return (
        ", ".join(f"{n}x {op}" for op, n in sorted(counted.items(), key=lambda kv: (-kv[1], kv[0])))
        or "(none)"
    )


def report(
    recorder: Recorder,
    events: list[dict[str, Any]],
    sizes: dict[tuple[str, str], int],
    envelope_sizes: tuple[int, int, int],
    job_id: str,
    webhook: Invocation,
    memory_gb: float,
    sweeper: Invocation,
    empty_receives: int,
    envelope: Any,
    routes: list[Invocation],
) -> int:
    n = len(STAGES)
    print()
    print(f"=== one {n}-stage job, success path ===")

    # --- state transitions
    entered = [e for e in events if e["type"].endswith("StateEntered")]
    in_stage = stage_state_names()
    stage_entered = [e for e in entered if e["stateEnteredEventDetails"]["name"] in in_stage]
    job_entered = [e for e in entered if e["stateEnteredEventDetails"]["name"] not in in_stage]
    per_stage: list[list[str]] = []
    current: list[str] = []
    for event in stage_entered:
        name = event["stateEnteredEventDetails"]["name"]
        # Each stage's iteration begins at the ItemProcessor's StartAt state.
        if name == stage_start_state() and current:
            per_stage.append(current)
            current = []
        current.append(name)
    if current:
        per_stage.append(current)
    budget = n * TRANSITIONS_PER_STAGE_BUDGET + TRANSITIONS_PER_JOB_BUDGET
    print()
    print("state transitions (*StateEntered events in the execution history)")
    for index, names in enumerate(per_stage):
        print(
            f"  stage {index} ({STAGES[index]['name'] if index < n else '?'}): {len(names)}  "
            f"{' > '.join(names)}"
        )
    print(
        f"  per job (outside the stages): {len(job_entered)}  "
        f"{' > '.join(e['stateEnteredEventDetails']['name'] for e in job_entered)}"
    )
    stages_ok = len(per_stage) == n and all(len(names) <= TRANSITIONS_PER_STAGE_BUDGET for names in per_stage)
    job_ok = len(job_entered) <= TRANSITIONS_PER_JOB_BUDGET
    total_ok = len(entered) <= budget
    print(
        f"  per stage <= {TRANSITIONS_PER_STAGE_BUDGET}: {'PASS' if stages_ok else 'FAIL'};"
        f" per job <= {TRANSITIONS_PER_JOB_BUDGET}: {'PASS' if job_ok else 'FAIL'}"
    )
    print(
        f"  total {len(entered)} <= {n}*{TRANSITIONS_PER_STAGE_BUDGET}+{TRANSITIONS_PER_JOB_BUDGET} = "
        f"{budget}: "
        f"{'PASS' if total_ok else 'FAIL'}"
    )
    transitions_ok = stages_ok and job_ok and total_ok

    # --- AWS calls by source
    print()
    print("AWS calls per job, by who made them")
    for source in SOURCES:
        calls = recorder.of(source)
        print(f"  {source:<14} {len(calls):>3}  {ops(calls)}")
    if empty_receives:
        print(
            f"  (agent double: {empty_receives} empty ReceiveMessage while the state machine had not sent "
            "yet; "
            "not charged here, covered by the idle-polling line)"
        )
    stray = [c for c in recorder.calls if c.source == "other" and c.service in ("dynamodb", "sqs")]
    if stray:
        print(f"  unattributed DynamoDB/SQS calls of other threads (not charged): {ops(stray)}")

    # --- DynamoDB units
    print()
    job_item = sizes.get((f"JOB#{job_id}", "JOB"), 0)
    stage_items = [
        size for (pk, sk), size in sizes.items() if pk == f"STAGES#{job_id}" and sk.startswith("STAGE#")
    ]
    others = {f"{pk}/{sk}": size for (pk, sk), size in sizes.items() if pk != f"JOB#{job_id}"}
    print("DynamoDB item sizes measured at the end of the run (names + values, DynamoDB's rules)")
    print(
        f"  job item (envelope JSON {envelope_sizes[0]} B, stored packed in {envelope_sizes[1]} B):"
        f" {job_item} B; stage items: "
        f"{', '.join(str(s) for s in sorted(stage_items))} B"
    )
    print("  others: " + ", ".join(f"{k.split('#')[0]} {v} B" for k, v in sorted(others.items())))
    print("DynamoDB request units per job")
    print(
        "  rules: write <= 1 KB = 1 WRU (TransactWriteItems: 2 per item), final item size (upper bound)"
        " used for updates; reads: strongly consistent <= 4 KB = 1 RRU, eventually consistent 0.5,"
    )
    print(
        "  a GetItem is charged for the whole item whatever its ProjectionExpression; GSI writes:"
        " KindIndex (ALL) per write of a `kind` item, StartPendingIndex 1 per write naming start_pending"
    )
    total = Units()
    rows: list[tuple[str, Units]] = []
    for source in SOURCES:
        units, notes = units_of(recorder.of(source, "dynamodb"), sizes)
        for note in notes:
            print(f"  note: {source}: {note}")
        rows.append((source, units))
        total.wru += units.wru
        total.gsi_wru += units.gsi_wru
        total.rru += units.rru
        total.writes += units.writes
        total.reads += units.reads
    print(f"  {'source':<14} {'writes':>6} {'WRU':>6} {'GSI WRU':>8} {'reads':>6} {'RRU':>6}")
    for source, units in [*rows, ("total", total)]:
        print(
            f"  {source:<14} {units.writes:>6} {units.wru:>6g} {units.gsi_wru:>8g} {units.reads:>6} "
            f"{units.rru:>6g}"
        )
    print("  writes by item, the most units first (size: the item's largest, rounded up to 1 KB a WRU)")
    print(f"    {'item':<26} {'how':<36} {'writes':>6} {'size B':>7} {'WRU':>4}")
    path_calls = [c for s in SOURCES for c in recorder.of(s, "dynamodb")]
    for written in writes_by_item(path_calls, sizes):
        print(
            f"    {written.item:<26} {written.how:<36} {written.writes:>6} {written.size:>7} {written.wru:>4}"
        )
    job_rows = [written for written in writes_by_item(path_calls, sizes) if written.item == "JOB#*/JOB"]
    job_writes = sum(written.writes for written in job_rows)
    job_kb = math.ceil(max(job_item, 1) / 1024)
    print(
        f"  in the GSI column: the job item is in ProjectJobsIndex and JobStatusIndex (template.yaml,"
        f" ProjectionType ALL), so each of its {job_writes} writes is one more in each of them,"
        f" {job_kb} WRU a write, and a status change one more (the old JobStatusIndex entry's delete)"
    )
    naive_rru = total.reads
    print(
        f"  (with every read taken as 1 RRU: {naive_rru} RRU; with every write item as 1 WRU and no GSI: "
        f"{sum(len(written_keys(c)) for s in SOURCES for c in recorder.of(s, 'dynamodb'))} WRU)"
    )

    # --- SQS
    sqs_calls = [c for s in SOURCES for c in recorder.of(s, "sqs")]
    sqs_counts = Counter(c.op for c in sqs_calls)
    sqs_requests = len(sqs_calls)
    print()
    print(
        f"SQS requests per job: {sqs_requests}  "
        f"({', '.join(f'{op} {k}' for op, k in sorted(sqs_counts.items()))};"
        " each message < 64 KB = 1 request)"
    )
    idle_month = IDLE_RECEIVES_PER_MIN * MINUTES_PER_MONTH
    print(
        f"  idle polling, per agent (assumption {IDLE_RECEIVES_PER_MIN} ReceiveMessage/min, 20 s long poll): "
        f"{idle_month:,} requests/month = ${idle_month * SQS_PER_REQUEST:.4f}/agent-month (fixed, not per "
        "job)"
    )

    # --- Lambda and API Gateway
    invocations = 1 + len(routes)
    gb_s = memory_gb * webhook.billed_sec + CLAIM_MEMORY_GB * sum(r.billed_sec for r in routes)
    api_requests = (
        invocations  # the webhook delivery, each claim and each outcome are one API Gateway request each
    )
    print()
    print(
        "Lambda duration per job, priced from what each function does in a warm execution environment"
        " (its role's session and clients kept from one invocation to the next): its threads' CPU"
        " time plus each AWS call it makes at its latency on AWS (side-by-side calls once), rounded up"
        " to 1 ms; never the emulator's answer time"
    )
    print(
        "  per call on AWS: "
        + ", ".join(f"{service} {sec * 1000:g} ms" for service, sec in AWS_CALL_SEC.items())
        + f", other services {OTHER_CALL_SEC * 1000:g} ms (sources: bench/critical_path.py LATENCY_MS)"
    )
    for name, invocation, memory in (
        ("webhook", webhook, memory_gb),
        *((f"{('claim', 'outcome')[i % 2]} {i // 2}", r, CLAIM_MEMORY_GB) for i, r in enumerate(routes)),
    ):
        print(
            f"  {name:<10} {invocation.billed_sec * 1000:>4.0f} ms billed ="
            f" {invocation.cpu_sec * 1000:6.1f} ms CPU + {len(invocation.calls)} calls"
            f" {invocation.aws_sec * 1000:4.0f} ms"
            f" x {memory * 1024:.0f} MB  (emulator wall time here: {invocation.wall_sec * 1000:.1f} ms)"
        )
    print("  (the first claim runs in a cold container: its imports are in its CPU)")
    print(f"  {gb_s:.4f} GB-s in all")
    print(
        f"API Gateway per job: {api_requests} REST requests (the delivery, and each stage's claim and "
        "outcome)"
    )
    print(
        "  sweeper (rate 1 minute) and schedule-trigger (per project schedule slot) invocations are not per "
        "job:"
        " see fixed monthly cost"
    )

    # --- Step Functions API calls are free; note them
    sfn_calls = [c for s in SOURCES for c in recorder.of(s, "stepfunctions")]
    print(
        f"Step Functions API calls (not billed for Standard workflows): {len(sfn_calls)} ({ops(sfn_calls)})"
    )

    # --- dollars per 1,000 jobs
    jobs = 1000
    wru = total.wru + total.gsi_wru
    table = [
        (
            "Step Functions transitions",
            f"{len(entered)} transitions",
            len(entered) * SFN_PER_TRANSITION * jobs,
            "$25/M transitions",
        ),
        (
            "DynamoDB writes",
            f"{wru:g} WRU ({total.wru:g} table + {total.gsi_wru:g} GSI)",
            wru * DDB_PER_WRU * jobs,
            "$0.625/M WRU",
        ),
        ("DynamoDB reads", f"{total.rru:g} RRU", total.rru * DDB_PER_RRU * jobs, "$0.125/M RRU"),
        (
            "SQS requests",
            f"{sqs_requests} requests",
            sqs_requests * SQS_PER_REQUEST * jobs,
            "$0.40/M requests",
        ),
        (
            "Lambda requests",
            f"{invocations} invocations",
            invocations * LAMBDA_PER_REQUEST * jobs,
            "$0.20/M requests",
        ),
        (
            "Lambda duration (arm64)",
            f"{gb_s:.4f} GB-s (own CPU + calls on AWS)",
            gb_s * LAMBDA_PER_GB_S * jobs,
            "$0.0000133334/GB-s",
        ),
        (
            "API Gateway (REST)",
            f"{api_requests} requests",
            api_requests * API_GATEWAY_PER_REQUEST * jobs,
            "$3.50/M requests",
        ),
    ]
    total_dollars = sum(row[2] for row in table)
    harness.report(
        "cost",
        f"state transitions per {n}-stage job",
        len(entered),
        f"{len(entered)}",
        f"<= {n}*{TRANSITIONS_PER_STAGE_BUDGET}+{TRANSITIONS_PER_JOB_BUDGET} = {budget}",
        transitions_ok,
    )
    harness.report(
        "cost",
        f"$ per 1,000 {n}-stage jobs",
        total_dollars,
        f"${total_dollars:.3f}",
        f"<= ${DOLLARS_PER_1000_JOBS:.2f}",
        total_dollars <= DOLLARS_PER_1000_JOBS,
    )
    print()
    print(f"dollars per 1,000 {n}-stage jobs, us-east-1 list prices")
    header = f"  {'component':<28} {'measured per job':<34} {'$ / 1,000 jobs':>14}  {'% ':>5}  price"
    print(header)
    print("  " + "-" * (len(header) - 2))
    for name, measured, dollars, price in table:
        share = 100 * dollars / total_dollars if total_dollars else 0
        print(f"  {name:<28} {measured:<34} {dollars:>14.5f}  {share:>4.0f}%  {price}")
    print("  " + "-" * (len(header) - 2))
    print(
        f"  {'total':<28} {'':<34} {total_dollars:>14.5f}        (${total_dollars:.5f} per 1,000 jobs, "
        f"${total_dollars * 1000:.2f} per million)"
    )
    print(
        "  not included: CloudWatch Logs, X-Ray, S3 artifacts, data transfer, STS (AssumeRole is free);"
        " lease renewals during a stage's run (below), and a renewal of a stage's credentials per hour it "
        "runs"
        " (one API Gateway request and Lambda invocation: about $0.0037 per 1,000 stage-hours)"
    )
    # A route call's Lambda seconds: the median of this run's claims and outcomes, priced as the
    # per-job row above.
    route_sec = sorted(r.billed_sec for r in routes)[len(routes) // 2]
    print()
    print("per 1,000 stage-minutes of run time (not in the per-job total: this job's stages take no time)")
    for lease, note in ((default_lease_sec(), "the default lease"), (envelope.lease_ttl_sec, "this job's")):
        for row in per_stage_minute(lease, route_sec):
            print(f"  lease {lease} s ({note}): " + row)
    print()
    print("what each addition of the last rounds costs, $ per 1,000 jobs (in the total above)")
    for name, measured, dollars in additions(recorder, sizes, routes):
        print(f"  {name:<58} {measured:<34} {dollars:>9.5f}")
    saved = packing_saving(recorder, job_id, job_item, envelope_sizes[2])
    print(
        f"  {'saving: the envelope packed on the job record':<58}"
        f" {f'{saved} WRU fewer ({envelope_sizes[2]} B -> {job_item} B)':<34}"
        f" {-saved * DDB_PER_WRU * 1000:>9.5f}"
    )

    # --- fixed monthly
    sweeper_calls = recorder.of("sweeper")
    sweeper_units, _ = units_of(sweeper_calls, sizes)
    ticks = MINUTES_PER_MONTH
    sweeper_lambda = ticks * (LAMBDA_PER_REQUEST + memory_gb * sweeper.billed_sec * LAMBDA_PER_GB_S)
    sweeper_ddb = ticks * (
        sweeper_units.rru * DDB_PER_RRU + (sweeper_units.wru + sweeper_units.gsi_wru) * DDB_PER_WRU
    )
    warmup = recorder.of("warmup")
    print()
    print(f"fixed monthly cost (30 days = {ticks:,} minutes), not per job")
    print(
        f"  sweeper, 1 tick/min: idle tick priced as above: {sweeper.billed_sec * 1000:.0f} ms, "
        f"{ops(sweeper_calls)}"
        f" = {sweeper_units.rru:g} RRU/tick"
    )
    print(
        f"    Lambda {ticks:,} invocations x (request + {memory_gb * 1024:.0f} MB x "
        f"{sweeper.billed_sec * 1000:.0f} ms) = "
        f"${sweeper_lambda:.4f}/month; DynamoDB ${sweeper_ddb:.4f}/month; total "
        f"${sweeper_lambda + sweeper_ddb:.4f}/month"
    )
    print(
        f"  idle agents: ${idle_month * SQS_PER_REQUEST:.4f}/agent-month of ReceiveMessage (assumption above)"
    )
    print(f"  cold webhook container, once per container: {ops(warmup)}")

    print()
    print(f"transition budget: {'PASS' if transitions_ok else 'FAIL'}")
    cheap_enough = total_dollars <= DOLLARS_PER_1000_JOBS
    print(
        f"${total_dollars:.3f} per 1,000 jobs <= ${DOLLARS_PER_1000_JOBS:.2f}: "
        f"{'PASS' if cheap_enough else 'FAIL'}"
    )
    return 0 if transitions_ok and cheap_enough else 1


def packing_saving(recorder: Recorder, job_id: str, packed_size: int, unpacked_size: int) -> int:
    """The write units the job record's writes of this job took fewer with its envelope packed
    (store/codec) than they would with it as a map: each write a KB a unit, twice in a transaction."""
    kb = math.ceil(max(unpacked_size, 1) / 1024) - math.ceil(max(packed_size, 1) / 1024)
    return sum(
        kb * (2 if transactional else 1)
        for source in SOURCES
        for call in recorder.of(source, "dynamodb")
        for key, transactional, _ in written_keys(call)
        if key == (f"JOB#{job_id}", "JOB")
    )


def default_lease_sec() -> int:
    from relevo_core.models.project import Project

    return int(Project.model_fields["lease_ttl_sec"].default)


@dataclass
class StageMinute:
    """A running stage's own calls a minute and what they cost per 1,000 stage-minutes."""

    renewals: float
    heartbeats: float
    dollars: float


def stage_minute(lease_ttl_sec: int, route_sec: float, every_renewal: bool = False) -> StageMinute:
    """The lease renewed every renew_interval_sec (the fenced UpdateItem of its stage record, under
    1 KB: 1 WRU) and the task heartbeaten every heartbeat_interval_sec through the heartbeat route
    (an API Gateway request and a Lambda invocation of `route_sec`; SendTaskHeartbeat itself is
    free: Standard workflows are priced by transition). `every_renewal`: the heartbeat with each
    renewal, as before the heartbeat got its own interval (relevo_core.fleet.lease_timeline)."""
    from relevo_core.fleet.lease_timeline import LeaseTimeline

    timeline = LeaseTimeline(lease_ttl_sec, 0)
    renewals = 60 / timeline.renew_interval_sec
    heartbeats = 60 / (timeline.renew_interval_sec if every_renewal else timeline.heartbeat_interval_sec)
    beat = API_GATEWAY_PER_REQUEST + LAMBDA_PER_REQUEST + CLAIM_MEMORY_GB * route_sec * LAMBDA_PER_GB_S
    return StageMinute(renewals, heartbeats, (renewals * DDB_PER_WRU + heartbeats * beat) * 1000)


def per_stage_minute(lease_ttl_sec: int, route_sec: float) -> list[str]:
    rows = []
    for label, every_renewal in (
        ("heartbeat every lease/3", False),
        ("heartbeat with each renewal (before)", True),
    ):
        minute = stage_minute(lease_ttl_sec, route_sec, every_renewal)
        rows.append(
            f"{label}: {minute.renewals:g} renewals (1 WRU each) + {minute.heartbeats:g} heartbeat route"
            f" calls = ${minute.dollars:.5f}"
        )
    return rows


def additions(
    recorder: Recorder, sizes: dict[tuple[str, str], int], routes: list[Invocation]
) -> list[tuple[str, str, float]]:
    """The per-job cost of what the last rounds added to the success path, each on its own: the
    outcome reported through the outcome route (its API Gateway request and Lambda invocation,
    each stage; the claims' are every other entry of routes), and the run token kept in the
    job's token partition (TOKENS#: a Put in AwaitResult's transaction, 2 WRU a KB)."""
    outcomes = routes[1::2]
    gb_s = CLAIM_MEMORY_GB * sum(r.billed_sec for r in outcomes)
    token_wru = sum(
        math.ceil(max(sizes.get(key, 1), 1) / 1024) * (2 if transactional else 1)
        for call in recorder.of("state_machine", "dynamodb")
        for key, transactional, _ in written_keys(call)
        if key[0].startswith("TOKENS#")
    )
    return [
        (
            "outcome route: API Gateway requests",
            f"{len(outcomes)} requests",
            len(outcomes) * API_GATEWAY_PER_REQUEST * 1000,
        ),
        (
            "outcome route: Lambda invocations and duration",
            f"{len(outcomes)} x ({gb_s / max(1, len(outcomes)):.4f} GB-s)",
            (len(outcomes) * LAMBDA_PER_REQUEST + gb_s * LAMBDA_PER_GB_S) * 1000,
        ),
        ("run tokens in TOKENS# (AwaitResult's Put)", f"{token_wru} WRU", token_wru * DDB_PER_WRU * 1000),
        *records_rows(recorder, sizes),
    ]


# Records the last rounds added, by key, as this job wrote them (a job without shards, caches or
# test reports writes none: its row says 0, counted, not assumed).
ADDED_RECORDS = (
    ("test plans (TESTPLAN#, the plans route per sharded stage)", lambda pk, sk: sk.startswith("TESTPLAN#")),
    ("cache records (CACHE#, per stage that caches)", lambda pk, sk: pk.startswith("CACHE#")),
    ("results summaries (LATEST#, per stage with test reports)", lambda pk, sk: sk.startswith("LATEST#")),
)


def records_rows(recorder: Recorder, sizes: dict[tuple[str, str], int]) -> list[tuple[str, str, float]]:
    """Each added record's writes in this job, by every source, in WRU (2 a KB in a transaction)."""
    rows = []
    for name, matches in ADDED_RECORDS:
        writes = [
            (key, transactional)
            for source in SOURCES
            for call in recorder.of(source, "dynamodb")
            for key, transactional, _ in written_keys(call)
            if matches(*key)
        ]
        wru = sum(math.ceil(max(sizes.get(key, 1), 1) / 1024) * (2 if t else 1) for key, t in writes)
        rows.append((name, f"{len(writes)} writes, {wru} WRU", wru * DDB_PER_WRU * 1000))
    plans = [c for c in recorder.of("claim") if c.op == "PutItem" and "TESTPLAN#" in json.dumps(c.params)]
    rows.append(
        (
            "test plan route: API Gateway requests and Lambda invocations",
            f"{len(plans)} requests",
            len(plans) * (API_GATEWAY_PER_REQUEST + LAMBDA_PER_REQUEST) * 1000,
        )
    )
    return rows


def main() -> int:
    began = time.perf_counter()
    recorder = Recorder()
    try:
        code = run(recorder)
    except Exception as exc:
        traceback.print_exc()
        print(f"bench error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    print(f"total {time.perf_counter() - began:.1f}s")
    return code


if __name__ == "__main__":
    sys.exit(main())
