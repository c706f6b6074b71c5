"""A fleet of 1,000 Macs, on paper from what the local stack stored and served (issue 47, point 3).

    .venv/bin/python bench/scale.py                      # ~1-2 min
    .venv/bin/python bench/scale.py --jobs 24 --renewals 40

The local stack cannot take a 1,000-Mac fleet's rate, so the bench drives a fraction of it and
counts: every request the emulator serves is recorded as it is served (the approach of
tests/integration/test_critical_path.py: moto's server application wrapped), whoever sent it --
the webhook and claim functions (called in this process as Lambda would, each call one API
Gateway request and one Lambda invocation), the agent's job session, the state machine's
interpreter. Two windows, one after the other, so that each count has one cause:

1. Jobs. `--jobs` signed GitHub pushes through the webhook function, over `--projects` projects;
   2 jobs of 3 have 4 stages, 1 of 3 has its second stage in 4 shards (the issue's fleet: 4 shards
   a job on a third of them). Each stage message is received, claimed through the claim route,
   ships `--chunks` log chunks with the job's session (the agent's ChunkWriter), reports its
   outcome through the outcome route, and its message is deleted. Until every execution ended.
2. Renewals. `--renewals` lease renewals of held attempts, each as the agent's keeper makes them:
   the lease's fenced write with the job's session, and the task heartbeat through the heartbeat
   route when it is due (relevo_core.fleet.lease_timeline: every renew_interval_sec the lease,
   every heartbeat_interval_sec the task).

The scaling, from counts to the fleet (the heart of the figure):
- per job: each API's calls and each key's units in window 1, divided by the jobs driven; per
  renewal: window 2's, divided by the renewals made.
- the fleet runs FLEET_JOBS_PER_SEC jobs a second (1,000 Macs, one job a minute each) and
  FLEET_RUNNING stages at once, each renewing every renew_interval_sec of the default lease
  (and heartbeating every heartbeat_interval_sec): an API's rate at 1,000 Macs is
  per job x jobs/s + per renewal x renewals/s.
- a key's rate depends on who shares it. A key naming no job or project (COUNTER#queued) is
  shared by the whole fleet: its units per job x jobs/s. A project's key: x the busiest project's
  share of the jobs (`--project-share`, an assumption, 10 % by default). A job's or a stage's key
  is its own job's: its units per job spread over the job's life at the fleet's pace (stages x
  FLEET_RUNNING / stage runs per second, by Little's law) -- not multiplied by the fleet; a
  lease's key takes one renewal per renew_interval_sec.
- units by DynamoDB's rules (each named below): a write of up to 1 KB is 1 WCU, a transaction's
  item 2; a strongly consistent read of up to 4 KB is 1 RCU, an eventually consistent one 0.5;
  the item's size is what is stored (a put's item as sent, an update's item as read at the end).
  GSI writes are not counted on the table's key (an index has partitions of its own).

Limits, each from its page (per account and region unless said); "adjustable" where the page
or Service Quotas says the quota can be raised, "hard" where it cannot:
- DynamoDB: 1,000 WCU/s and 3,000 RCU/s per partition key, hard (a partition's own throughput:
  https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/bp-partition-key-design.html);
  item sizes and units: .../developerguide/CapacityUnitCalculations.html, transactions double:
  .../developerguide/transaction-apis.html#transaction-capacity-handling.
- Step Functions Standard, "Quotas related to API action throttling"
  (https://docs.aws.amazon.com/step-functions/latest/dg/service-quotas.html; the same table in
  awsdocs/aws-step-functions-developer-guide, doc_source/limits-overview.md), token buckets,
  adjustable ("soft quotas and can be increased"), by region: in US East (N. Virginia), US West
  (Oregon) and Europe (Ireland) StartExecution refills 300/s (bucket 1,300), SendTaskSuccess,
  SendTaskFailure and SendTaskHeartbeat 500/s each (bucket 3,000), DescribeExecution 15/s (bucket
  300); in every other region StartExecution 150/s (800), SendTask* 300/s each (1,500),
  DescribeExecution 10/s (250). Each SendTask* action has its own bucket.
- API Gateway: 10,000 requests/s per account and region across REST, HTTP and WebSocket APIs
  (2,500/s in 13 newer regions: Cape Town, Milan, Jakarta, UAE, Hyderabad, Melbourne, Spain,
  Zurich, Tel Aviv, Calgary, Malaysia, Thailand, Mexico), adjustable (Service Quotas L-8A5B8E43)
  (https://docs.aws.amazon.com/apigateway/latest/developerguide/limits.html).
- Lambda: 1,000 concurrent executions per region by default, adjustable
  (https://docs.aws.amazon.com/lambda/latest/dg/gettingstarted-limits.html); concurrency is
  invocations/s x seconds each (https://docs.aws.amazon.com/lambda/latest/dg/lambda-concurrency.html),
  the seconds an assumption (LAMBDA_SEC_ON_AWS), the emulator's only shown.
- STS: 600 requests/s per account and region, shared by AssumeRole and STS's other credential
  calls (calls AWS services make for you are not counted) ("IAM and AWS STS quotas",
  https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_iam-quotas.html; the stored copy of
  that page predates the figure, which is taken as quoted from it). Not in Service Quotas: taken
  as hard here (re:Post "iam-sts-throttling-error": IAM and STS rate quotas cannot be raised).
- SQS standard queues: "nearly unlimited" calls per action
  (https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/quotas-messages.html):
  shown, no limit.

Target: every key and every API at >= 10 x the fleet's rate. Exits 0 when met, 1 when missed, 2
when the bench itself broke.

Issue 45's and 46's keys (a stage's `tests` summary, its results document in S3, a test plan
record per sharded stage, cache entry records per project and region): `NEXT_KEYS` below is where
their writes join window 1 once they land; until then they are counted on paper (printed).
"""

from __future__ import annotations

import argparse
import io
import json
import math
import re
import secrets
import sys
import threading
import time
import traceback
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402  (the repository root is on the path first)

# The fleet (issue 47): 1,000 Macs at one job a minute each, every Mac running a stage.
FLEET_MACS = 1000
FLEET_JOBS_PER_SEC = FLEET_MACS / 60
FLEET_RUNNING = FLEET_MACS
SHARDS = 4
SHARDED_SHARE = 1 / 3
PLAIN = [{"name": n, "run": "true"} for n in ("build", "test", "sign", "upload")]
SHARDED = [
    {"name": "build", "run": "true"},
    {"name": "test", "run": "true", "parallel": SHARDS},
    {"name": "sign", "run": "true"},
    {"name": "upload", "run": "true"},
]
# Stage runs per job (a shard is a run of its own on a Mac of its own).
RUNS_PER_JOB = (1 - SHARDED_SHARE) * len(PLAIN) + SHARDED_SHARE * (len(SHARDED) - 1 + SHARDS)
REGION = "eu-west"
HEADROOM = 10.0

STREAM_POLLER = {
    "dynamodb:GetRecords",
    "dynamodb:GetShardIterator",
    "dynamodb:DescribeStream",
    "dynamodb:ListStreams",
}
# DynamoDB's per-partition limits.
KEY_WCU = 1000
KEY_RCU = 3000
# API quotas a second, per account and region, each with the page above: (the three largest
# regions, every other region).
SFN_START = (300, 150)
SFN_SEND_TASK = (500, 300)  # each of SendTaskSuccess, SendTaskFailure, SendTaskHeartbeat
SFN_DESCRIBE = (15, 10)
BIG_REGIONS = "us-east-1, us-west-2, eu-west-1"
API_GATEWAY_RPS = (10_000, 2_500)  # most regions, the 13 newer ones
LAMBDA_CONCURRENCY = 1000
STS_REQUESTS = 600
# A warm Lambda invocation's seconds on AWS: an assumption (see api_rates).
LAMBDA_SEC_ON_AWS = 0.1

# Issue 45's and 46's keys, on paper until they land (their briefs; writes per job). When their
# code is in, window 1 stores them (the agent double's test results and cache save) and these
# lines go: each is (key pattern, who shares it, writes per job, note).
NEXT_KEYS = [
    (
        "STAGES#<job> / STAGE#nn tests summary",
        "job",
        0,
        "rides on the outcome's fenced write: no write of its own",
    ),
    ("S3 <job prefix>/results/<stage>.json", "job", RUNS_PER_JOB, "one PUT per stage run, the job's prefix"),
    ("test plan record per sharded stage", "job", SHARDED_SHARE, "one conditional put, the first shard"),
    ("cache entry CACHE#<project>#<region>", "project", 2, "a lookup read and, on a miss, one put per job"),
]


# ------------------------------------------------------------------------------------------------
# What the emulator serves


@dataclass(frozen=True)
class Served:
    at: float
    call: str  # service:Action
    body: dict[str, Any]


class Served_Log:
    """Every request moto's server application serves, with its JSON body (DynamoDB, Step
    Functions and SQS speak JSON; STS and S3 are counted by action or method)."""

    def __init__(self) -> None:
        self.served: list[Served] = []
        self._lock = threading.Lock()

    def between(self, start: float, end: float) -> list[Served]:
        with self._lock:
            return [s for s in self.served if start <= s.at <= end]

    @contextmanager
    def recording(self) -> Iterator[Served_Log]:
        from moto.moto_server.werkzeug_app import DomainDispatcherApplication

        serve = DomainDispatcherApplication.__call__
        log = self

        def served(app: Any, environ: dict[str, Any], start_response: Any) -> Any:
            length = int(environ.get("CONTENT_LENGTH") or 0)
            raw = environ["wsgi.input"].read(length) if length else b""
            environ["wsgi.input"] = io.BytesIO(raw)  # put back for moto
            call, body = _call_of(environ, raw)
            try:
                return serve(app, environ, start_response)
            finally:
                with log._lock:
                    log.served.append(Served(time.time(), call, body))

        DomainDispatcherApplication.__call__ = served  # type: ignore[method-assign]  # recorded
        try:
            yield self
        finally:
            DomainDispatcherApplication.__call__ = serve  # type: ignore[method-assign]  # put back


def _call_of(environ: dict[str, Any], raw: bytes) -> tuple[str, dict[str, Any]]:
    found = re.search(r"Credential=[^/]+/[^/]+/[^/]+/([^/]+)/", environ.get("HTTP_AUTHORIZATION", ""))
    service = found.group(1) if found else "-"
    target = environ.get("HTTP_X_AMZ_TARGET", "")
    if target:
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            body = {}
        return f"{service}:{target.rsplit('.', 1)[-1]}", body if isinstance(body, dict) else {}
    action = re.search(rb"Action=(\w+)", raw + environ.get("QUERY_STRING", "").encode())
    return f"{service}:{action.group(1).decode() if action else environ['REQUEST_METHOD']}", {}


JOB_ID = re.compile(r"job_[0-9a-z]{26}")
# Sent only by the claim function's routes, in a request that names no job (a task token, STS's
# form): theirs when served while one of the driven routes was in flight.
ROUTED = ("states:SendTaskSuccess", "states:SendTaskFailure", "states:SendTaskHeartbeat", "sts:AssumeRole")


def ours(served: list[Served], job_ids: set[str], spans: list[tuple[float, float]]) -> list[Served]:
    """The requests of these jobs: none that names another job (on a stack shared with other
    work, an earlier job's state machine may still write and send), and a routed call only
    while a route was in flight. On the bench's own stack nothing else runs: all are kept."""

    def kept(s: Served) -> bool:
        if s.call in ROUTED:
            return any(start <= s.at <= end for start, end in spans)
        return all(named in job_ids for named in JOB_ID.findall(json.dumps(s.body)))

    return [s for s in served if kept(s)]


# ------------------------------------------------------------------------------------------------
# Keys and units


def key_pattern(pk: str, ids: dict[str, str]) -> tuple[str, str]:
    """(the partition key with its ids named, who shares it: fleet, project, job, or one
    request's own, a key naming an id of neither: a delivery, a commit)."""
    shared = "fleet"
    for value, name in sorted(ids.items(), key=lambda kv: -len(kv[0])):
        if value in pk:
            pk = pk.replace(value, f"<{name}>")
            shared = "job" if name == "job" or shared == "job" else "project"
    pk, jobs = re.subn(r"job_[0-9a-z]{16,}", "<job>", pk)
    if jobs:
        shared = "job"
    pk, others = re.subn(r"[0-9a-f]{8}-[0-9a-f-]{27}|[0-9a-f]{12,}", "<id>", pk)
    if others and shared != "job":
        shared = "request"
    return pk, shared


@dataclass
class KeyUnits:
    wcu: float = 0.0
    rcu: float = 0.0
    writes: int = 0
    reads: int = 0


def _size(item: dict[str, Any]) -> int:
    from bench.cost import item_size

    return item_size(item)


def units_by_key(served: list[Served], final_sizes: dict[tuple[str, str], int]) -> dict[str, KeyUnits]:
    """Each partition key's WCU and RCU in these requests, by DynamoDB's rules; keyed by pk."""
    out: dict[str, KeyUnits] = defaultdict(KeyUnits)

    def write(pk_sk: tuple[str, str], item: dict[str, Any] | None, transactional: bool) -> None:
        size = _size(item) if item is not None else final_sizes.get(pk_sk, 1024)
        units = math.ceil(max(size, 1) / 1024) * (2 if transactional else 1)
        out[pk_sk[0]].wcu += units
        out[pk_sk[0]].writes += 1

    def read(pk: str, size: int, consistent: bool) -> None:
        out[pk].rcu += math.ceil(max(size, 1) / 4096) * (1 if consistent else 0.5)
        out[pk].reads += 1

    for s in served:
        service, action = s.call.split(":", 1)
        if service != "dynamodb":
            continue
        b = s.body
        if action == "PutItem":
            write(_pk_sk(b["Item"]), b["Item"], False)
        elif action in ("UpdateItem", "DeleteItem"):
            write(_pk_sk(b["Key"]), None, False)
        elif action == "TransactWriteItems":
            for entry in b["TransactItems"]:
                ((kind, body),) = entry.items()
                if kind == "ConditionCheck":
                    # A condition check reads its item, charged as a write (DynamoDB's
                    # transaction capacity rules): 2 units per KB like the rest.
                    write(_pk_sk(body["Key"]), None, True)
                else:
                    write(_pk_sk(body.get("Item") or body["Key"]), body.get("Item"), True)
        elif action == "BatchWriteItem":
            for requests in b["RequestItems"].values():
                for request in requests:
                    item = request.get("PutRequest", {}).get("Item")
                    write(_pk_sk(item or request["DeleteRequest"]["Key"]), item, False)
        elif action == "GetItem":
            pk_sk = _pk_sk(b["Key"])
            read(pk_sk[0], final_sizes.get(pk_sk, 1024), bool(b.get("ConsistentRead")))
        elif action == "TransactGetItems":
            for entry in b["TransactItems"]:
                pk_sk = _pk_sk(entry["Get"]["Key"])
                out[pk_sk[0]].rcu += 2 * math.ceil(max(final_sizes.get(pk_sk, 1024), 1) / 4096)
                out[pk_sk[0]].reads += 1
        elif action == "BatchGetItem":
            for request in b["RequestItems"].values():
                for k in request["Keys"]:
                    pk_sk = _pk_sk(k)
                    read(pk_sk[0], final_sizes.get(pk_sk, 1024), bool(request.get("ConsistentRead")))
        elif action == "Query" and not b.get("IndexName"):
            # Its partition: the key condition's value for pk (a Query reads one partition).
            pk = _query_pk(b)
            if pk is not None:
                # A query's units are by the bytes it read; at most 1 MB a page. Counted as one
                # item's worth unless the answer said more (upper bound kept small: 4 KB).
                read(pk, 4096, bool(b.get("ConsistentRead")))
    return out


def _pk_sk(attrs: dict[str, Any]) -> tuple[str, str]:
    return attrs["pk"]["S"], attrs.get("sk", {}).get("S", "")


def _query_pk(body: dict[str, Any]) -> str | None:
    condition = body.get("KeyConditionExpression", "")
    names = body.get("ExpressionAttributeNames", {})
    values = body.get("ExpressionAttributeValues", {})
    for placeholder, value in values.items():
        named = re.search(rf"(#\w+|pk)\s*=\s*{re.escape(placeholder)}\b", condition)
        if named:
            name = named.group(1)
            if names.get(name, name) == "pk":
                return value.get("S")
    return None


def final_sizes_of(served: list[Served], table: str) -> dict[tuple[str, str], int]:
    """The size of every item an update or a read touched, as stored at the end."""
    from relevo_core.aws import client

    keys: set[tuple[str, str]] = set()
    for s in served:
        service, action = s.call.split(":", 1)
        if service != "dynamodb":
            continue
        if action in ("UpdateItem", "DeleteItem", "GetItem"):
            keys.add(_pk_sk(s.body["Key"]))
        elif action == "TransactWriteItems":
            for entry in s.body["TransactItems"]:
                ((_, body),) = entry.items()
                if "Key" in body:
                    keys.add(_pk_sk(body["Key"]))
    ddb = client("dynamodb")
    sizes = {}
    for pk, sk in keys:
        item = ddb.get_item(TableName=table, Key={"pk": {"S": pk}, "sk": {"S": sk}}, ConsistentRead=True).get(
            "Item"
        )
        if item:
            sizes[(pk, sk)] = _size(item)
    return sizes


# ------------------------------------------------------------------------------------------------
# The drive


@dataclass
class Routes:
    """The claim function as Lambda runs it (its own role), each call one API Gateway request and
    one Lambda invocation; the seconds each took."""

    handler: Any
    role: str
    calls: Counter[str] = field(default_factory=Counter)
    seconds: list[float] = field(default_factory=list)
    # When each call was in flight (time.time()): what the function sent is served within one.
    spans: list[tuple[float, float]] = field(default_factory=list)

    def post(self, route: str, body: dict[str, Any], agent_id: str) -> dict[str, Any]:
        with harness.as_role(self.role):
            began = time.perf_counter()
            sent = time.time()
            answer = self.handler.lambda_handler(
                harness.claim_event(
                    REGION, body, f"arn:aws:sts::123456789012:assumed-role/agent/{agent_id}", route=route
                ),
                harness.LambdaContext(),
            )
            self.seconds.append(time.perf_counter() - began)
            self.spans.append((sent, time.time()))
        self.calls[route] += 1
        if answer["statusCode"] != 200:
            raise RuntimeError(f"{route}: {answer['statusCode']} {answer['body']}")
        return dict(json.loads(answer["body"]))


@dataclass
class Held:
    """A claimed attempt: what the agent keeps of it."""

    request: dict[str, Any]
    ref: Any
    credentials: Any
    envelope: Any
    message: dict[str, Any]


def claim(routes: Routes, stack: Any, message: dict[str, Any], agent_id: str) -> Held:
    from relevo_agent.claim import new_claim_secret
    from relevo_agent.claim_routes import session_credentials
    from relevo_core.aws import JobCredentials
    from relevo_core.models.agent_session import ClaimGranted
    from relevo_core.models.envelope import read_envelope
    from relevo_core.store import stage_attempts

    task = json.loads(message["Body"])
    request = {
        "job_id": task["job_id"],
        "stage_index": task["stage_index"],
        "attempt": task["attempt"],
        "agent_id": agent_id,
        "claim_secret": new_claim_secret(),
        "dispatch_key": task["dispatch_key"],
        "dispatch_token": task["task_token"],
    }
    if task.get("shard") is not None:
        request["shard"] = task["shard"]
    granted = ClaimGranted.model_validate(routes.post("claims", request, agent_id))
    ref = stage_attempts.StageRef(
        stack.table_name,
        task["job_id"],
        task["stage_index"],
        task["attempt"],
        agent_id,
        shard=task.get("shard"),
    )
    return Held(
        request,
        ref,
        JobCredentials(session_credentials(granted.session)),
        read_envelope(granted.envelope),
        message,
    )


def wait_run_handed(held: Held) -> None:
    from bench.cost import poll
    from relevo_core.aws import job_scope
    from relevo_core.store import stage_claims

    with job_scope(held.credentials):
        poll(lambda: stage_claims.run_handed(held.ref) or None, 30, "no run token handed", 0.02)


def ship_log(held: Held, chunks: int) -> None:
    from relevo_core.aws import job_scope
    from relevo_core.store.log_writer import ChunkWriter

    with job_scope(held.credentials):
        writer = ChunkWriter(
            held.ref,
            f"stage-{held.ref.stage_index}",
            held.envelope.log_expires_at,
            held.envelope.artifact_uri,
        )
        for n in range(chunks):
            writer.append(f"line {n} of {held.ref.job_id}\n" * 20, datetime.now(UTC))


def report_outcome(routes: Routes, held: Held) -> None:
    keys = ("job_id", "stage_index", "attempt", "agent_id", "claim_secret", "shard")
    outcome = {k: held.request[k] for k in keys if k in held.request}
    routes.post(
        "outcomes",
        {**outcome, "status": "succeeded", "outcome": "succeeded", "exit_code": 0},
        held.request["agent_id"],
    )


def renew(routes: Routes, held: Held, heartbeat: bool) -> None:
    """One round of the agent's keeper (relevo_agent.keeper.keep_lease)."""
    from relevo_core.aws import job_scope
    from relevo_core.store import stage_attempts

    with job_scope(held.credentials):
        stage_attempts.renew_lease(held.ref, int(held.envelope.lease_ttl_sec), datetime.now(UTC))
    if heartbeat:
        keys = ("job_id", "stage_index", "attempt", "agent_id", "claim_secret", "shard")
        routes.post("heartbeats", {k: held.request[k] for k in keys if k in held.request}, held.ref.agent_id)


def receive(stack: Any, wanted: int, timeout: float, job_ids: set[str]) -> list[dict[str, Any]]:
    """Up to `wanted` stage messages of `job_ids` (another's, on a stack shared with other work,
    is left to come back to its own agent)."""
    from relevo_core.aws import client

    sqs, got = client("sqs"), []
    deadline = time.monotonic() + timeout
    while len(got) < wanted and time.monotonic() < deadline:
        got += [
            message
            for message in sqs.receive_message(
                QueueUrl=stack.work_queues[REGION], MaxNumberOfMessages=10, WaitTimeSeconds=1
            ).get("Messages", [])
            if json.loads(message["Body"]).get("job_id") in job_ids
        ]
    return got


def delete(stack: Any, message: dict[str, Any]) -> None:
    from relevo_core.aws import client

    client("sqs").delete_message(QueueUrl=stack.work_queues[REGION], ReceiptHandle=message["ReceiptHandle"])


@dataclass
class Window:
    served: list[Served]
    routes: Counter[str]
    route_seconds: list[float]
    route_spans: list[tuple[float, float]] = field(default_factory=list)
    webhooks: int = 0
    webhook_seconds: list[float] = field(default_factory=list)


def drive_jobs(
    stack: Any, routes: Routes, projects: list[tuple[str, str]], jobs: int, chunks: int, log: Served_Log
) -> tuple[Window, set[str], float]:
    """Window 1: `jobs` jobs through intake, claims, logs and outcomes until each ended."""
    handler = harness.cold_handler("webhook")
    began = time.time()
    routes.calls.clear()
    routes.seconds.clear()
    routes.spans.clear()
    window = Window([], Counter(), [])
    job_ids: set[str] = set()
    for n in range(jobs):
        project_id, secret = projects[n % len(projects)]
        body = harness.push_body(f"acme/{project_id}", secrets.token_hex(20))
        event = harness.webhook_event(project_id, harness.github_headers(secret, body), body)
        started = time.perf_counter()
        answer = handler.lambda_handler(event, harness.LambdaContext())
        window.webhook_seconds.append(time.perf_counter() - started)
        window.webhooks += 1
        if answer["statusCode"] != 202:
            raise RuntimeError(f"webhook: {answer['statusCode']} {answer['body']}")
        job_ids.add(json.loads(answer["body"])["job_id"])
    ended: set[str] = set()
    deadline = time.monotonic() + 60 + 10 * jobs
    agent = 0
    while len(ended) < len(job_ids):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(job_ids) - len(ended)} job(s) still running")
        messages = receive(stack, 10, 2, job_ids)
        helds = []
        for message in messages:
            agent += 1
            helds.append(claim(routes, stack, message, f"scale-mac-{agent % FLEET_MACS}"))
        for held in helds:
            wait_run_handed(held)
            ship_log(held, chunks)
            report_outcome(routes, held)
            delete(stack, held.message)
        if not messages:
            ended |= {job_id for job_id in job_ids - ended if _ended(stack, job_id)}
    time.sleep(0.5)  # the last state's writes answered
    window.served = ours(log.between(began, time.time()), job_ids, routes.spans)
    window.routes = Counter(routes.calls)
    window.route_seconds = list(routes.seconds)
    window.route_spans = list(routes.spans)
    failed = [job_id for job_id in job_ids if _status(stack, job_id) != "SUCCEEDED"]
    if failed:
        raise RuntimeError(f"{len(failed)} job(s) did not succeed: {failed[:3]}")
    return window, job_ids, time.time() - began


def _status(stack: Any, job_id: str) -> str:
    """The job's execution's status, on whichever job machine runs it (a job that queued for its
    project runs the queued one)."""
    from relevo_core.execution import execution_status

    return execution_status(stack.machines, job_id)


def _ended(stack: Any, job_id: str) -> bool:
    return _status(stack, job_id) != "RUNNING"


def drive_renewals(
    stack: Any, routes: Routes, project: tuple[str, str], renewals: int, log: Served_Log
) -> tuple[Window, int, int]:
    """Window 2: attempts held and renewed as the keeper does, `renewals` rounds in all; returns
    the window, the rounds and the heartbeats among them."""
    from relevo_core.fleet.lease_timeline import LeaseTimeline

    handler = harness.cold_handler("webhook")
    project_id, secret = project
    holders: list[Held] = []
    body = harness.push_body(f"acme/{project_id}", secrets.token_hex(20))
    answer = handler.lambda_handler(
        harness.webhook_event(project_id, harness.github_headers(secret, body), body), harness.LambdaContext()
    )
    assert answer["statusCode"] == 202, answer
    for message in receive(stack, 1, 30, {json.loads(answer["body"])["job_id"]}):
        held = claim(routes, stack, message, "scale-renewer")
        wait_run_handed(held)
        holders.append(held)
    if not holders:
        raise RuntimeError("no stage to hold for the renewals")
    timeline = LeaseTimeline(int(holders[0].envelope.lease_ttl_sec), 0)
    every = max(1, math.ceil(timeline.heartbeat_interval_sec / timeline.renew_interval_sec))
    time.sleep(0.5)
    routes.calls.clear()
    routes.seconds.clear()
    routes.spans.clear()
    began = time.time()
    beats = 0
    for n in range(renewals):
        beat = (n + 1) % every == 0
        beats += beat
        renew(routes, holders[n % len(holders)], beat)
    ended = time.time()
    served = ours(log.between(began, ended), {held.ref.job_id for held in holders}, routes.spans)
    window = Window(served, Counter(routes.calls), list(routes.seconds), list(routes.spans))
    for held in holders:
        report_outcome(routes, held)
        delete(stack, held.message)
    return window, renewals, beats


# ------------------------------------------------------------------------------------------------
# The figures


@dataclass
class Rate:
    name: str
    per_sec: float
    limit: float
    source: str
    adjustable: bool
    # What would bring a short rate to HEADROOM (said in the table when it is short).
    fix: str = ""

    @property
    def headroom(self) -> float:
        return self.limit / self.per_sec if self.per_sec else math.inf


# What would fix each API that can fall short, said beside it in the table.
FIXES = {
    "StartExecution": "one execution a job: a quota increase (Service Quotas), or a stack in one of the 3",
    "SendTaskSuccess": "two task tokens a stage run (the dispatch's, the run's): one token a run, or a quota "
    "increase",
    "SendTaskHeartbeat": "a heartbeat every lease/3: a longer default lease, or a quota increase",
    "STS": "a job session per claim: reusable only between plain stages on one Mac (same tags)",
    "DescribeExecution": "none on the path",
}


def api_rates(
    jobs: Window, n_jobs: int, renewals: Window, n_renewals: int, renewals_per_sec: float
) -> list[Rate]:
    """Each API's calls a second at 1,000 Macs: per job x jobs/s + per renewal x renewals/s,
    against its quota in the three largest regions and in every other (Step Functions, API
    Gateway) or in every region."""

    def per_sec(job_count: float, renewal_count: float) -> float:
        return job_count / n_jobs * FLEET_JOBS_PER_SEC + renewal_count / n_renewals * renewals_per_sec

    def served(window: Window, *calls: str) -> int:
        return sum(1 for s in window.served if s.call in calls)

    def both(*calls: str) -> float:
        return per_sec(served(jobs, *calls), served(renewals, *calls))

    describes = per_sec(
        served(jobs, "states:DescribeExecution") - _bench_describes(jobs),
        served(renewals, "states:DescribeExecution"),
    )
    rows = []
    for where, n in ((BIG_REGIONS, 0), ("other regions", 1)):
        rows += [
            Rate(
                f"Step Functions StartExecution ({where})",
                both("states:StartExecution"),
                SFN_START[n],
                f"{SFN_START[n]}/s",
                True,
                FIXES["StartExecution"],
            ),
            Rate(
                f"Step Functions SendTaskSuccess ({where})",
                both("states:SendTaskSuccess"),
                SFN_SEND_TASK[n],
                f"{SFN_SEND_TASK[n]}/s",
                True,
                FIXES["SendTaskSuccess"],
            ),
            Rate(
                f"Step Functions SendTaskFailure ({where})",
                both("states:SendTaskFailure"),
                SFN_SEND_TASK[n],
                f"{SFN_SEND_TASK[n]}/s",
                True,
            ),
            Rate(
                f"Step Functions SendTaskHeartbeat ({where})",
                both("states:SendTaskHeartbeat"),
                SFN_SEND_TASK[n],
                f"{SFN_SEND_TASK[n]}/s",
                True,
                FIXES["SendTaskHeartbeat"],
            ),
            Rate(
                f"Step Functions DescribeExecution ({where})",
                describes,
                SFN_DESCRIBE[n],
                f"{SFN_DESCRIBE[n]}/s",
                True,
                FIXES["DescribeExecution"],
            ),
        ]
    rows.append(
        Rate("STS AssumeRole", both("sts:AssumeRole"), STS_REQUESTS, f"{STS_REQUESTS}/s", False, FIXES["STS"])
    )
    gateway_jobs = jobs.webhooks + sum(jobs.routes.values())
    gateway_renewals = sum(renewals.routes.values())
    for where, limit in (("most regions", API_GATEWAY_RPS[0]), ("13 newer regions", API_GATEWAY_RPS[1])):
        rows.append(
            Rate(
                f"API Gateway requests ({where})",
                per_sec(gateway_jobs, gateway_renewals),
                limit,
                f"{limit:,}/s",
                True,
            )
        )
    # Lambda concurrency is invocations/s x seconds each. The seconds measured here are the
    # emulator's (moto answers one DynamoDB request at a time, ~10x AWS): shown, not the figure.
    # The figure takes LAMBDA_SEC_ON_AWS a warm invocation, an assumption: 2-4 round trips in a
    # row (tests/integration/test_critical_path.py) of ~10-30 ms each, with Powertools' own work.
    rows.append(
        Rate(
            f"Lambda concurrency (invocations/s x {LAMBDA_SEC_ON_AWS:g} s, assumed)",
            per_sec(gateway_jobs, gateway_renewals) * LAMBDA_SEC_ON_AWS,
            LAMBDA_CONCURRENCY,
            "1,000",
            True,
        )
    )
    seconds = sum(jobs.webhook_seconds) + sum(jobs.route_seconds) + sum(renewals.route_seconds)
    print(
        f"(Lambda seconds on the emulator, {seconds / max(1, gateway_jobs + gateway_renewals):.3f} s a call:"
        " not AWS's)"
    )
    return rows


# The bench's own DescribeExecution calls (whether each job ended) are not Relevo's.
_BENCH_DESCRIBES: dict[int, int] = {}


def _bench_describes(window: Window) -> int:
    return _BENCH_DESCRIBES.get(id(window), 0)


def key_rates(
    jobs: Window,
    n_jobs: int,
    renewals: Window,
    n_renewals: int,
    renew_interval: float,
    ids: dict[str, str],
    sizes: dict[tuple[str, str], int],
    project_share: float,
) -> list[tuple[str, str, float, float, float]]:
    """(key pattern, shared by, WCU/s, RCU/s, writes per job) of every partition key at 1,000 Macs."""
    # Little's law: a stage run lasts FLEET_RUNNING / (jobs/s x runs per job) seconds; a job's
    # keys take its writes over its runs in a row (a sharded stage's runs side by side: the
    # shorter life, so the higher rate).
    run_sec = FLEET_RUNNING / (FLEET_JOBS_PER_SEC * RUNS_PER_JOB)
    job_sec = len(PLAIN) * run_sec
    totals: dict[tuple[str, str], KeyUnits] = defaultdict(KeyUnits)
    per_key_jobs: dict[tuple[str, str], set[str]] = defaultdict(set)
    for pk, units in units_by_key(jobs.served, sizes).items():
        pattern = key_pattern(pk, ids)
        totals[pattern].wcu += units.wcu
        totals[pattern].rcu += units.rcu
        totals[pattern].writes += units.writes
        per_key_jobs[pattern].add(pk)
    rows = []
    for (pattern, shared), units in totals.items():
        keys = len(per_key_jobs[(pattern, shared)])
        if shared == "fleet":
            factor = FLEET_JOBS_PER_SEC / n_jobs
            wcu, rcu = units.wcu * factor, units.rcu * factor
        elif shared == "project":
            factor = FLEET_JOBS_PER_SEC * project_share / n_jobs
            wcu, rcu = units.wcu * factor, units.rcu * factor
        elif shared == "request":
            # One key a request (a delivery's, a commit's): written once, its rate a job's.
            wcu, rcu = units.wcu / keys, units.rcu / keys
        else:
            # One key a job (or a stage, a shard): its units over its own life.
            wcu, rcu = units.wcu / keys / job_sec, units.rcu / keys / job_sec
        rows.append((pattern, shared, wcu, rcu, units.writes / n_jobs))
    # Window 2 renews one held attempt: each of its keys' units per renewal, one renewal per
    # renew_interval (every attempt renews its own keys; a heartbeat reads its job's records).
    for pk, units in units_by_key(renewals.served, sizes).items():
        pattern, shared = key_pattern(pk, ids)
        rate = 1 / renew_interval / n_renewals
        rows.append((pattern + " (lease renewals)", shared, units.wcu * rate, units.rcu * rate, 0.0))
    return sorted(rows, key=lambda row: -max(row[2] / KEY_WCU, row[3] / KEY_RCU))


def run(args: argparse.Namespace) -> int:
    log = Served_Log()
    with harness.local_stack(prefix="relevo-scale-") as stack, log.recording():
        return measure(stack, args, log)


@dataclass
class Counted:
    """What a driven slice of the fleet made: window 1's jobs, window 2's renewals, and what the
    counts are read with (the ids that name a key's sharers, the items' sizes as stored)."""

    jobs: Window
    job_ids: set[str]
    jobs_sec: float
    renewals: Window
    n_renewals: int
    beats: int
    ids: dict[str, str]
    sizes: dict[tuple[str, str], int]


def claim_routes(stack: Any) -> Routes:
    """The claim function, as its own role in its own environment, built once (a warm container)."""
    from relevo_core.aws import client

    claim_role = client("iam").get_role(RoleName=stack.resources["AgentSessionsRole"])["Role"]["Arn"]
    harness.use_function_environment(stack, "AgentSessionsFunction")
    with harness.as_role(claim_role):
        routes = Routes(harness.cold_handler("agent_sessions"), claim_role)
    harness.use_function_environment(stack, "WebhookFunction")
    return routes


def drive(
    stack: Any,
    log: Served_Log,
    projects: list[tuple[str, str]],
    renewer: tuple[str, str],
    jobs: int,
    chunks: int,
    renewals: int,
) -> Counted:
    """Both windows, `jobs` pushes round-robin over `projects` and `renewals` renewals of an
    attempt of `renewer`'s job, each project (id, webhook secret) registered with the default
    lease; counted from what `log` recorded."""
    routes = claim_routes(stack)
    jobs_window, job_ids, jobs_sec = drive_jobs(stack, routes, projects, jobs, chunks, log)
    describes = sum(1 for s in jobs_window.served if s.call == "states:DescribeExecution")
    _BENCH_DESCRIBES[id(jobs_window)] = describes  # every one is the bench's own (_ended)
    renewals_window, n_renewals, beats = drive_renewals(stack, routes, renewer, renewals, log)
    sizes = final_sizes_of(jobs_window.served + renewals_window.served, stack.table_name)
    ids = {job_id: "job" for job_id in job_ids}
    ids.update({project_id: "project" for project_id, _ in projects})
    ids[renewer[0]] = "project"
    for s in renewals_window.served:
        for text in json.dumps(s.body).split('"'):
            if text.startswith("job-") or re.fullmatch(r"[0-9a-f-]{36}", text):
                ids.setdefault(text, "job")
    return Counted(jobs_window, job_ids, jobs_sec, renewals_window, n_renewals, beats, ids, sizes)


# Calls a job or a renewal makes whose count does not depend on timing (an agent's receives and
# its look for the run token poll): what tests/integration/test_scale_counts.py pins.
COUNTED_CALLS = (
    "states:StartExecution",
    "states:SendTaskSuccess",
    "states:SendTaskFailure",
    "states:SendTaskHeartbeat",
    "sts:AssumeRole",
    "sqs:SendMessage",
)


def calls_per(window: Window, n: int) -> dict[str, float]:
    """COUNTED_CALLS served, each route's requests (`route:<name>`) and webhook deliveries, per
    job (or per renewal), rounded to 1/100."""
    counted = Counter(s.call for s in window.served if s.call in COUNTED_CALLS)
    counted.update({f"route:{route}": calls for route, calls in window.routes.items()})
    if window.webhooks:
        counted["route:webhook"] = window.webhooks
    return {call: round(calls / n, 2) for call, calls in sorted(counted.items())}


def write_units_per(window: Window, n: int, counted: Counted) -> dict[str, float]:
    """Each key pattern's write units (DynamoDB's rules, sizes as stored) per job (or renewal)."""
    units: dict[str, float] = defaultdict(float)
    for pk, key in units_by_key(window.served, counted.sizes).items():
        if key.wcu:
            units[key_pattern(pk, counted.ids)[0]] += key.wcu
    return {pattern: round(wcu / n, 2) for pattern, wcu in sorted(units.items())}


def registered(stack: Any, name: str, stages: list[dict[str, Any]], lease: int) -> tuple[str, str]:
    project_id = f"{name}-" + secrets.token_hex(2)
    secret = harness.register_project(stack, project_id, stages, lease_ttl_sec=lease, queue_timeout_sec=120)
    assert secret is not None
    return project_id, secret


def measure(stack: Any, args: argparse.Namespace, log: Served_Log) -> int:
    from relevo_core.fleet.lease_timeline import LeaseTimeline
    from relevo_core.models.project import Project

    default_lease = Project.model_fields["lease_ttl_sec"].default
    timeline = LeaseTimeline(default_lease, 0)
    harness.use_function_environment(stack, "WebhookFunction")
    # Every third project's jobs have a stage of 4 shards: a third of the jobs (jobs round-robin).
    projects = [
        registered(stack, f"scale-{n}", SHARDED if n % 3 == 2 else PLAIN, default_lease)
        for n in range(args.projects)
    ]
    renewer = registered(stack, "scale-renew", PLAIN, default_lease)
    counted = drive(stack, log, projects, renewer, args.jobs, args.chunks, args.renewals)
    jobs_window, job_ids, renewals_window, n_renewals = (
        counted.jobs,
        counted.job_ids,
        counted.renewals,
        counted.n_renewals,
    )
    print(
        f"window 1: {len(job_ids)} jobs in {counted.jobs_sec:.1f} s ({len(jobs_window.served)} requests"
        f" served); window 2: {n_renewals} renewals, {counted.beats} with a heartbeat"
        f" ({len(renewals_window.served)} served)"
    )
    renewals_per_sec = FLEET_RUNNING / timeline.renew_interval_sec
    apis = api_rates(jobs_window, len(job_ids), renewals_window, n_renewals, renewals_per_sec)
    keys = key_rates(
        jobs_window,
        len(job_ids),
        renewals_window,
        n_renewals,
        timeline.renew_interval_sec,
        counted.ids,
        counted.sizes,
        args.project_share,
    )
    return report(apis, keys, timeline, len(job_ids), jobs_window, renewals_window, n_renewals)


def report(
    apis: list[Rate],
    keys: list[tuple[str, str, float, float, float]],
    timeline: Any,
    n_jobs: int,
    jobs: Window,
    renewals: Window,
    n_renewals: int,
) -> int:
    print()
    print(
        f"=== a fleet of {FLEET_MACS:,} Macs: {FLEET_JOBS_PER_SEC:.1f} jobs/s,"
        f" {FLEET_RUNNING:,} stages running,"
        f" {SHARDED_SHARE:.2f} of jobs with a stage of {SHARDS} shards ({RUNS_PER_JOB:.2f} stage runs a job);"
        f" default lease {timeline.lease_ttl_sec} s: renewed every {timeline.renew_interval_sec:g} s,"
        f" task heartbeat every {timeline.heartbeat_interval_sec:g} s"
    )
    # The local stack's stream poller (Lambda's event source mapping on AWS, no caller's call)
    # and its schedules are not a job's.
    counted = Counter(s.call for s in jobs.served if s.call.split(":")[0] not in ("scheduler",))
    counted = Counter({k: v for k, v in counted.items() if k not in STREAM_POLLER})
    print(
        f"per job (window 1, {n_jobs} jobs): "
        + ", ".join(
            f"{op} {n / n_jobs:.2f}"
            for op, n in sorted(counted.items())
            if not op.startswith("dynamodb:Describe")
        )
    )
    print("  routes per job: " + ", ".join(f"{r} {n / n_jobs:.2f}" for r, n in sorted(jobs.routes.items())))
    counted = Counter(s.call for s in renewals.served if s.call not in STREAM_POLLER)
    print(
        f"per renewal (window 2, {n_renewals}): "
        + ", ".join(f"{op} {n / n_renewals:.2f}" for op, n in sorted(counted.items()))
    )
    missed = 0
    print()
    print(f"{'API':<62} {'at 1,000 Macs':>14} {'limit':>10} {'quota':>10} {'headroom':>9}")
    for rate in apis:
        ok = rate.headroom >= HEADROOM
        missed += not ok
        quota = "adjustable" if rate.adjustable else "hard"
        print(
            f"{rate.name:<62} {rate.per_sec:>12.1f}/s {rate.source:>10} {quota:>10} {rate.headroom:>8.1f}x"
            + ("" if ok else f" short: {rate.fix}")
        )
        harness.report(
            "scale",
            rate.name,
            rate.per_sec,
            f"{rate.per_sec:.1f}/s ({rate.headroom:.0f}x)" + ("" if ok else " short"),
            f">= {HEADROOM:g}x under {rate.source} ({quota})",
            ok,
        )
    print()
    print(
        f"{'partition key (who shares it)':<62} {'WCU/s':>8} {'RCU/s':>8} {'headroom':>9} {'writes/job':>10}"
    )
    for pattern, shared, wcu, rcu, writes in keys[:15]:
        headroom = min(KEY_WCU / wcu if wcu else math.inf, KEY_RCU / rcu if rcu else math.inf)
        print(
            f"{pattern + ' (' + shared + ')':<62} {wcu:>8.1f} {rcu:>8.1f} {headroom:>8.1f}x {writes:>10.2f}"
        )
    busiest_w = max(keys, key=lambda row: row[2])
    busiest_r = max(keys, key=lambda row: row[3])
    for label, row, value, limit in (
        ("busiest partition key, WCU/s", busiest_w, busiest_w[2], KEY_WCU),
        ("busiest partition key, RCU/s", busiest_r, busiest_r[3], KEY_RCU),
    ):
        headroom = limit / value if value else math.inf
        ok = headroom >= HEADROOM
        missed += not ok
        print(f"{label}: {row[0]} {value:.1f} against {limit:,}: {headroom:.1f}x {'' if ok else 'MISSED'}")
        harness.report(
            "scale",
            label,
            value,
            f"{value:.1f} ({row[0]}, {headroom:.0f}x)",
            f">= {HEADROOM:g}x under {limit:,}",
            ok,
        )
    print()
    print("on paper until they land (issue 45, 46; NEXT_KEYS):")
    for pattern, shared, writes, note in NEXT_KEYS:
        print(f"  {pattern} ({shared}): {writes:.2f} writes a job -- {note}")
    return 1 if missed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=6, help="jobs driven in window 1 (default 6)")
    parser.add_argument("--projects", type=int, default=6, help="projects they are spread over (default 6)")
    parser.add_argument("--chunks", type=int, default=2, help="log chunks each stage ships (default 2)")
    parser.add_argument("--renewals", type=int, default=30, help="lease renewals in window 2 (default 30)")
    parser.add_argument(
        "--project-share", type=float, default=0.1, help="the busiest project's share of the fleet's jobs"
    )
    args = parser.parse_args(argv)
    began = time.perf_counter()
    try:
        code = run(args)
    except Exception as exc:
        traceback.print_exc()
        print(f"bench error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    print(f"total {time.perf_counter() - began:.1f}s")
    return code


if __name__ == "__main__":
    sys.exit(main())
