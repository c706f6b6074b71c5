"""Helpers that talk to the embedded stack the way clients and agents do."""

from __future__ import annotations

import importlib.util
import json
import secrets
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import requests

from relevo_cli.api import RelevoApi
from relevo_cli.projects import secret_name
from relevo_core.aws import client
from relevo_core.files.stack import StackInfo
from relevo_core.intake.webhooks.github import sign
from relevo_core.store.codec import from_attributes
from relevo_core.store.keys import COUNTER_SK, QUEUE_COUNTER_PK, key


def register_project(stack: StackInfo, project_id: str, stages: list[dict[str, Any]], **extra: Any) -> str:
    """Register a project through the API with a fresh webhook secret; returns the secret."""
    secret = secrets.token_urlsafe(16)
    name = secret_name(stack, project_id, "github")
    client("secretsmanager").create_secret(Name=name, SecretString=secret)
    RelevoApi.for_stack(stack).put_project(
        project_id,
        {
            "repo": f"acme/{project_id}",
            "region_affinity": "eu-west",
            "lease_ttl_sec": 10,
            "queue_timeout_sec": 30,
            "stages": stages,
            "webhook": {"github_secret_ref": name},
            **extra,
        },
    )
    return secret


def deliver(
    stack: StackInfo, project_id: str, body: bytes, secret: str, event: str = "push", **headers: str
) -> requests.Response:
    return requests.post(
        f"{stack.api_url}/webhooks/github/{project_id}",
        data=body,
        headers={
            "Content-Type": "application/json",
            "X-GitHub-Event": event,
            "X-GitHub-Delivery": secrets.token_hex(8),
            "X-Hub-Signature-256": sign(secret, body),
            **headers,
        },
        timeout=60,
    )


def subscribe_to_notifications(stack: StackInfo, name: str) -> str:
    """A new SQS queue subscribed (raw delivery) to the stack's notification topic; its URL."""
    sqs = client("sqs")
    queue_url = sqs.create_queue(QueueName=name)["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    client("sns").subscribe(
        TopicArn=stack.resources["NotificationTopic"],
        Protocol="sqs",
        Endpoint=queue_arn,
        Attributes={"RawMessageDelivery": "true"},
    )
    return queue_url


def table_items(stack: StackInfo, prefix: str) -> list[dict[str, Any]]:
    """Every item whose partition key starts with prefix (scan: tests only)."""
    items = []
    kwargs: dict[str, Any] = {
        "TableName": stack.table_name,
        "FilterExpression": "begins_with(pk, :p)",
        "ExpressionAttributeValues": {":p": {"S": prefix}},
    }
    while True:
        page = client("dynamodb").scan(**kwargs)
        items.extend(page["Items"])
        if "LastEvaluatedKey" not in page:
            return items
        kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]


def queued_counter(stack: StackInfo) -> int:
    """The stack-wide count of queued jobs (the counter intake checks against QueueLimit)."""
    item = (
        client("dynamodb")
        .get_item(TableName=stack.table_name, Key=key(QUEUE_COUNTER_PK, COUNTER_SK), ConsistentRead=True)
        .get("Item")
    )
    return int(from_attributes(item).get("queued", 0)) if item else 0


class QueueSlots:
    """The stack-wide queued-jobs counter as one project's jobs move it.

    The counter is the stack's, and jobs of earlier tests on the worker's stack (waiting behind
    their project's lock, timing out, started by a late wake) still take and give back slots
    while a test runs, so reading the counter before and after an action sees their moves too.
    Each slot taken or given back is a job entering or leaving status queued in the transaction
    that moves the counter. A reading therefore takes the counter with the set of queued jobs
    (JobStatusIndex), read again until the two agree, and `change` leaves out what jobs of other
    projects did between two readings."""

    def __init__(self, stack: StackInfo, project_id: str) -> None:
        self.stack, self.project_id = stack, project_id
        self.count, self.queued = self._reading()

    def _queued_jobs(self) -> set[tuple[str, str]]:
        from relevo_core.store.jobs_by_status import jobs_with_status
        from relevo_core.store.keys import PROJECT_JOBS_ATTRIBUTE

        return {
            (item["job_id"], item[PROJECT_JOBS_ATTRIBUTE])
            for item in jobs_with_status(self.stack.table_name, "queued")
        }

    def _reading(self) -> tuple[int, set[tuple[str, str]]]:
        while True:
            before, count, after = self._queued_jobs(), queued_counter(self.stack), self._queued_jobs()
            if before == after:
                return count, after

    def change(self) -> int:
        """How far the counter moved since the last reading for this project's jobs: its move,
        less the slots other projects' jobs took (entered queued) or gave back (left it)
        meanwhile. With nothing of the project's moving, 0 whatever the rest of the stack does."""
        count, queued = self._reading()
        others_entered = sum(1 for _, project in queued - self.queued if project != self.project_id)
        others_left = sum(1 for _, project in self.queued - queued if project != self.project_id)
        moved = count - self.count - others_entered + others_left
        self.count, self.queued = count, queued
        return moved


@contextmanager
def queue_filled(stack: StackInfo, queue_limit: int) -> Iterator[None]:
    """The queued-jobs counter raised by `queue_limit` for the block, so anything that would take a
    queue slot is refused QUEUE_FULL. The counter is shared by every job of the stack, and jobs of
    earlier tests still give their slots back: ADD up and down keeps those changes, where reading
    before and after would see them."""

    def add(delta: int) -> None:
        client("dynamodb").update_item(
            TableName=stack.table_name,
            Key=key(QUEUE_COUNTER_PK, COUNTER_SK),
            UpdateExpression="ADD queued :delta",
            ExpressionAttributeValues={":delta": {"N": str(delta)}},
        )

    # A counter below zero (a test that set it by hand, or an emulator restart mid-run) would leave
    # the queue short of full: raised by that much more, and lowered by the same.
    found = client("dynamodb").get_item(
        TableName=stack.table_name, Key=key(QUEUE_COUNTER_PK, COUNTER_SK), ConsistentRead=True
    )
    delta = queue_limit + max(0, -int(found.get("Item", {}).get("queued", {}).get("N", "0")))
    add(delta)
    try:
        yield
    finally:
        add(-delta)


def receive_stage(
    stack: StackInfo, job_id: str, region: str = "eu-west", timeout: float = 15
) -> tuple[dict[str, Any], str]:
    """What an agent would receive next for this job from the region's queue.

    Each test worker has its own stack and runs one test at a time, so stage messages of other
    jobs (left by earlier tests whose jobs nobody runs) are discarded.
    """
    sqs = client("sqs")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        response = sqs.receive_message(
            QueueUrl=stack.work_queues[region], WaitTimeSeconds=1, MaxNumberOfMessages=10
        )
        found = None
        for message in response.get("Messages", []):
            body = json.loads(message["Body"])
            if body["job_id"] == job_id and found is None:
                found = (body, message["ReceiptHandle"])
            else:
                sqs.delete_message(QueueUrl=stack.work_queues[region], ReceiptHandle=message["ReceiptHandle"])
        if found:
            return found
    raise TimeoutError(f"no stage message for {job_id} in {region} within {timeout}s")


def job_execution_arn(stack: StackInfo, job_id: str) -> str:
    """The job's execution: on JobStateMachine when intake took its project's lock (its record
    says so), else on JobQueuedStateMachine (relevo_core.store.keys.MACHINE_ATTRIBUTE)."""
    item = client("dynamodb").get_item(
        TableName=stack.table_name,
        Key={"pk": {"S": f"JOB#{job_id}"}, "sk": {"S": "JOB"}},
        ProjectionExpression="machine",
        ConsistentRead=True,
    )
    took_lock = item.get("Item", {}).get("machine", {}).get("S") == "run"
    machine = stack.state_machine_arn if took_lock else stack.queued_state_machine_arn
    return machine.replace(":stateMachine:", ":execution:") + f":{job_id}"


def wait_for_execution(stack: StackInfo, job_id: str, timeout: float = 20) -> dict[str, Any]:
    arn = job_execution_arn(stack, job_id)
    deadline = time.monotonic() + timeout
    while True:
        described = client("stepfunctions").describe_execution(executionArn=arn)
        if described["status"] != "RUNNING":
            return described
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"execution {job_id} still RUNNING after {timeout}s; its last events: "
                f"{_last_events(stack, job_id)}"
            )
        time.sleep(0.1)


def _last_events(stack: StackInfo, job_id: str, count: int = 12) -> str:
    """Where a stuck execution is: its last history events, each as type and state name."""
    described = []
    for event in history(stack, job_id)[-count:]:
        details = next((value for key, value in event.items() if key.endswith("EventDetails")), {})
        what = details.get("name") or details.get("error") or details.get("resourceType") or ""
        described.append(f"{event['type']}({what})")
    return ", ".join(described)


def history(stack: StackInfo, job_id: str) -> list[dict[str, Any]]:
    arn = job_execution_arn(stack, job_id)
    events: list[dict[str, Any]] = []
    kwargs: dict[str, Any] = {"executionArn": arn}
    while True:
        page = client("stepfunctions").get_execution_history(**kwargs)
        events.extend(page["events"])
        if not page.get("nextToken"):
            return events
        kwargs["nextToken"] = page["nextToken"]


def wait_until(predicate: Any, timeout: float, what: str = "condition", interval: float = 0.1) -> Any:
    """Poll until `predicate()` returns something truthy, and return it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"{what}: not reached within {timeout}s")


# ---------------------------------------------------------------- a function's handler, run here

FUNCTIONS = Path(__file__).resolve().parents[2] / "functions"


class LambdaContext:
    """The context Lambda hands a handler (what Powertools' decorators read from it)."""

    def __init__(self, function: str) -> None:
        self.function_name = f"relevo-{function}"
        self.function_version = "$LATEST"
        self.memory_limit_in_mb = 256
        self.invoked_function_arn = f"arn:aws:lambda:us-east-1:123456789012:function:relevo-{function}"
        self.log_group_name = f"/aws/lambda/relevo-{function}"
        self.log_stream_name = "test"
        self.aws_request_id = str(uuid.uuid4())

    def get_remaining_time_in_millis(self) -> int:
        return 30_000


def load_handler(function_dir: str) -> Callable[[dict[str, Any], Any], Any]:
    """`functions/<function_dir>/handler.py`'s lambda_handler, freshly imported."""
    spec = importlib.util.spec_from_file_location(
        f"{function_dir}_handler", FUNCTIONS / function_dir / "handler.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.lambda_handler


def metrics_printed(monkeypatch: Any) -> None:
    """Powertools set up as in a deployed function: metrics on, printed as EMF to stdout."""
    monkeypatch.setenv("POWERTOOLS_SERVICE_NAME", "relevo")
    monkeypatch.setenv("POWERTOOLS_METRICS_NAMESPACE", "Relevo")
    monkeypatch.setenv("POWERTOOLS_TRACE_DISABLED", "true")
    monkeypatch.delenv("POWERTOOLS_METRICS_DISABLED", raising=False)
    # The shared Metrics object may have been built (without a namespace) by an earlier test.
    from relevo_core.observability import metrics

    monkeypatch.setattr(metrics, "namespace", "Relevo")


def emf_documents(stdout: str, namespace: str = "Relevo") -> list[dict[str, Any]]:
    """The CloudWatch embedded-metric-format documents a handler printed, each in `namespace`."""
    documents = []
    for line in stdout.splitlines():
        if not line.startswith("{") or '"_aws"' not in line:
            continue
        document = json.loads(line)
        assert all(d["Namespace"] == namespace for d in document["_aws"]["CloudWatchMetrics"])
        documents.append(document)
    return documents


def emf_values(stdout: str) -> dict[str, list[float]]:
    """Every metric value printed, by metric name, in the order printed."""
    values: dict[str, list[float]] = {}
    for document in emf_documents(stdout):
        for directive in document["_aws"]["CloudWatchMetrics"]:
            for metric in directive["Metrics"]:
                value = document[metric["Name"]]
                values.setdefault(metric["Name"], []).extend(value if isinstance(value, list) else [value])
    return values


def use_stack(patch: Any, stack: StackInfo) -> None:
    """Point this process's boto3 at `stack` (endpoint, region, its own credentials) for the life
    of `patch` (a pytest MonkeyPatch), and drop cached clients of the stack it left."""
    from relevo_core.aws import reset_clients

    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN"):
        patch.delenv(name, raising=False)
    for name, value in stack.environment().items():
        patch.setenv(name, value)
    reset_clients()


def job_items(stack: StackInfo, job_id: str) -> list[dict[str, Any]]:
    """A job's record and its stage records: the job partition and the stages partition
    (store/keys.py), in raw attribute form."""
    return [
        i
        for prefix in (f"JOB#{job_id}", f"STAGES#{job_id}")
        for i in table_items(stack, prefix)
        if i["pk"]["S"] == prefix
    ]


def job_record(stack, job_id) -> dict:
    return {i["sk"]["S"]: from_attributes(i) for i in table_items(stack, f"JOB#{job_id}")}["JOB"]


def lock_record(stack, project_id) -> dict:
    return {i["sk"]["S"]: from_attributes(i) for i in table_items(stack, f"LOCK#{project_id}")}["LOCK"]


@contextmanager
def stream_captured(stack: StackInfo) -> Iterator[list[dict[str, Any]]]:
    """Every batch the table's stream delivers while the block runs, as Lambda would get it (a
    poller of the test's own, beside the stack's)."""
    from relevo_local.streams import StreamPoller

    table = client("dynamodb").describe_table(TableName=stack.table_name)["Table"]
    batches: list[dict[str, Any]] = []
    poller = StreamPoller(client("dynamodbstreams"), table["LatestStreamArn"], 100, batches.append, "test")
    stopping = threading.Event()
    poller.start(stopping, interval_sec=0.2)
    try:
        yield batches
    finally:
        stopping.set()


def job_stream_records(batches: list[dict[str, Any]], job_id: str) -> list[dict[str, Any]]:
    return [
        r
        for b in batches
        for r in b["Records"]
        if r["dynamodb"]["Keys"]["pk"]["S"] in (f"JOB#{job_id}", f"STAGES#{job_id}")
    ]


@contextmanager
def regions_stack(state_dir: Path, regions: tuple[str, ...]) -> Iterator[tuple[StackInfo, Path]]:
    """`relevo local up` with these region affinities, this process pointed at it: (its stack,
    its stack.json), for a module's agents; the clients are dropped after it."""
    import pytest

    from relevo_core.aws import reset_clients
    from relevo_local.processes import local_stack

    with (
        pytest.MonkeyPatch.context() as patch,
        local_stack(
            state_dir, state_dir / "local-up.log", ["--region-affinities", ",".join(regions)]
        ) as info,
    ):
        use_stack(patch, info)
        yield info, state_dir / "stack.json"
    reset_clients()


@contextmanager
def regions_of(shared: tuple[StackInfo, Path], regions: tuple[str, ...]) -> Iterator[tuple[StackInfo, Path]]:
    """A module's part of a stack started for several (tests/e2e/conftest.py's shared_stack):
    the same (stack, stack.json), this process pointed at it for the block, once the stack is seen
    to hold each of the module's region affinities; the clients are dropped after it."""
    import pytest

    from relevo_core.aws import reset_clients

    info, stack_file = shared
    missing = sorted(set(regions) - set(info.work_queues))
    assert not missing, f"regions {missing} are not in the shared stack's SHARED_REGIONS"
    with pytest.MonkeyPatch.context() as patch:
        use_stack(patch, info)
        yield info, stack_file
    reset_clients()
