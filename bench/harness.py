"""What the benches share: the embedded stack started and stopped around a bench, this process
pointed at it, projects registered through its API, every AWS API call of this process seen
through botocore, and a function's handler loaded and called in this process as Lambda would.

Imports of moto, boto3 and relevo's packages are made inside the functions: bench/agent.py sets
the emulator's recorder path before moto is first imported.
"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FUNCTIONS_DIR = ROOT / "functions"
CORE_DIR = ROOT / "layers" / "core"

# Environment for a handler called in this process. Tracing off (no X-Ray daemon here); logs at
# WARNING so the bench output stays readable (the log level does not change which AWS calls are
# made).
HANDLER_ENV = {
    "POWERTOOLS_TRACE_DISABLED": "true",
    "POWERTOOLS_SERVICE_NAME": "relevo",
    "POWERTOOLS_METRICS_NAMESPACE": "Relevo",
    "POWERTOOLS_LOG_LEVEL": "WARNING",
}


# ------------------------------------------------------------------------------------------------
# The stack


@contextmanager
def local_stack(
    state_dir: Path | None = None, prefix: str = "relevo-bench-", note: str = ""
) -> Iterator[Any]:
    """The embedded stack (moto + template.yaml) in this process, in `state_dir` or a temporary
    one, with this process pointed at it; stopped on the way out. Yields its StackInfo."""
    from relevo_local.stack import LocalStack

    with ExitStack() as scratch:
        directory = state_dir or Path(scratch.enter_context(tempfile.TemporaryDirectory(prefix=prefix)))
        began = time.perf_counter()
        stack = LocalStack(state_dir=directory)
        info = stack.start()
        print(f"stack up in {time.perf_counter() - began:.1f}s ({info.aws_endpoint}){note}")
        try:
            point_at_stack(info)
            yield info
        finally:
            stack.stop()


def point_at_stack(stack: Any) -> None:
    """This process's boto3 clients (and relevo_core's) talk to the embedded stack."""
    # Endpoint, region and the stack's own IAM user (its emulator refuses any other key).
    stack.apply_to_environment()
    from relevo_core.aws import reset_clients

    reset_clients()


def register_project(
    stack: Any,
    project_id: str,
    stages: list[dict[str, Any]],
    lease_ttl_sec: int = 10,
    queue_timeout_sec: int = 30,
    webhook: bool = True,
    region: str = "eu-west",
) -> str | None:
    """A project of region affinity `region`, registered through the API; with `webhook`, a fresh
    GitHub webhook secret is stored for it, and returned."""
    from relevo_cli.api import RelevoApi
    from relevo_cli.projects import secret_name
    from relevo_core.aws import client

    project: dict[str, Any] = {
        "repo": f"acme/{project_id}",
        "region_affinity": region,
        "lease_ttl_sec": lease_ttl_sec,
        "queue_timeout_sec": queue_timeout_sec,
        "stages": stages,
    }
    secret = None
    if webhook:
        secret = secrets.token_urlsafe(16)
        name = secret_name(stack, project_id, "github")
        client("secretsmanager").create_secret(Name=name, SecretString=secret)
        project["webhook"] = {"github_secret_ref": name}
    RelevoApi.for_stack(stack).put_project(project_id, project)
    return secret


# ------------------------------------------------------------------------------------------------
# AWS call recording


def record_aws_calls(
    on_call: Callable[[Any, dict[str, Any], Any], None],
    on_attempt: Callable[[], None] | None = None,
) -> Callable[[], None]:
    """Wrap botocore's Endpoint: `on_call(operation_model, request_dict, (http_response, parsed))`
    after every API call whichever client made it (relevo_core's cached clients and Powertools'
    own alike), and `on_attempt()` before each HTTP attempt, so retries show. A call botocore
    gives up on (it raises) is not passed to `on_call`. Both run in the calling thread: they tell
    threads apart themselves. Returns what puts botocore back as it was (a bench leaves the
    wrapper for the rest of its process; a test undoes it)."""
    from botocore.endpoint import Endpoint

    make_request = Endpoint.make_request
    send = Endpoint._send

    def recording_make_request(endpoint: Any, operation_model: Any, request_dict: Any) -> Any:
        result = make_request(endpoint, operation_model, request_dict)
        try:
            on_call(operation_model, request_dict, result)
        except Exception as exc:  # never let the bench's bookkeeping break a call
            sys.stderr.write(f"recorder: {type(exc).__name__}: {exc}\n")
        return result

    def recording_send(endpoint: Any, request: Any) -> Any:
        if on_attempt is not None:
            on_attempt()
        return send(endpoint, request)

    Endpoint.make_request = recording_make_request  # type: ignore[method-assign]  # calls recorded
    Endpoint._send = recording_send  # type: ignore[method-assign]  # calls recorded

    def restore() -> None:
        Endpoint.make_request = make_request  # type: ignore[method-assign]  # put back
        Endpoint._send = send  # type: ignore[method-assign]  # put back

    return restore


class ThreadCalls:
    """The AWS API calls one thread makes between start() and stop(), as "service:Operation", and
    its HTTP attempts. Calls of other threads (the embedded stack's own, moto's Step Functions
    interpreter) are not counted."""

    def __init__(self) -> None:
        self.thread_id: int | None = None
        self.calls: list[str] = []
        self.attempts = 0
        self._restore: Callable[[], None] | None = None

    def install(self) -> ThreadCalls:
        self._restore = record_aws_calls(self._call, self._attempt)
        return self

    def uninstall(self) -> None:
        if self._restore is not None:
            self._restore()
            self._restore = None

    def _call(self, operation_model: Any, request_dict: Any, result: Any) -> None:
        if self.thread_id == threading.get_ident():
            self.calls.append(f"{operation_model.service_model.service_name}:{operation_model.name}")

    def _attempt(self) -> None:
        if self.thread_id == threading.get_ident():
            self.attempts += 1

    def start(self) -> None:
        self.calls, self.attempts = [], 0
        self.thread_id = threading.get_ident()

    def stop(self) -> tuple[list[str], int]:
        self.thread_id = None
        return self.calls, self.attempts


# ------------------------------------------------------------------------------------------------
# A function's handler, called in this process


def use_function_environment(stack: Any, logical_id: str) -> tuple[dict[str, Any], dict[str, str]]:
    """This process's environment set as the function's (less its Powertools settings, which
    HANDLER_ENV replaces); returns its configuration and the variables taken from it."""
    import boto3

    function = boto3.client("lambda").get_function_configuration(FunctionName=stack.resources[logical_id])
    variables = {k: str(v) for k, v in function.get("Environment", {}).get("Variables", {}).items()}
    variables = {k: v for k, v in variables.items() if not k.startswith("POWERTOOLS_")}
    os.environ.update(variables)
    os.environ.update(HANDLER_ENV)
    return function, variables


def cold_handler(function: str) -> Any:
    """functions/<function>/handler.py imported as in a new container: the layer and the
    function's own directory on the path, and nothing a warm container keeps (cached clients,
    settings, projects, secrets, queue URLs, the minutes of recorded refusals, the projects found
    busy) left over in this process."""
    from aws_lambda_powertools.utilities import parameters

    from relevo_core.aws import reset_clients
    from relevo_core.config import intake_settings
    from relevo_core.execution import work_queue_url
    from relevo_core.intake.busy_projects import busy_projects
    from relevo_core.intake.project_cache import project_cache
    from relevo_core.intake.webhooks.refusals import refusal_minutes
    from relevo_core.observability import metrics

    reset_clients()
    intake_settings.cache_clear()
    project_cache.clear()
    busy_projects.clear()
    refusal_minutes.clear()
    # A new container's Metrics takes its namespace from the environment it starts in.
    metrics.namespace = os.environ.get("POWERTOOLS_METRICS_NAMESPACE")
    work_queue_url.cache_clear()
    parameters.clear_caches()
    function_dir = FUNCTIONS_DIR / function
    for path in (str(CORE_DIR), str(function_dir)):
        if path not in sys.path:
            sys.path.insert(0, path)
    spec = importlib.util.spec_from_file_location(f"{function}_handler", function_dir / "handler.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class LambdaContext:
    function_name = "relevo-WebhookFunction"
    function_version = "$LATEST"
    memory_limit_in_mb = 512
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:relevo-WebhookFunction"
    log_group_name = "/aws/lambda/relevo-WebhookFunction"
    log_stream_name = "bench"

    def __init__(self) -> None:
        self.aws_request_id = str(uuid.uuid4())
        self._deadline = time.monotonic() + 15

    def get_remaining_time_in_millis(self) -> int:
        return int((self._deadline - time.monotonic()) * 1000)


def _api_event(
    resource: str,
    path: str,
    path_parameters: dict[str, str],
    headers: dict[str, str],
    body: str,
    identity: dict[str, str],
) -> dict[str, Any]:
    """An API Gateway REST proxy event of a POST, as API Gateway sends it to the function."""
    return {
        "resource": resource,
        "path": path,
        "httpMethod": "POST",
        "headers": headers,
        "multiValueHeaders": {name: [value] for name, value in headers.items()},
        "queryStringParameters": None,
        "multiValueQueryStringParameters": None,
        "pathParameters": path_parameters,
        "stageVariables": None,
        "requestContext": {
            "resourcePath": resource,
            "httpMethod": "POST",
            "path": f"/v1{path}",
            "stage": "v1",
            "accountId": "123456789012",
            "apiId": "bench",
            "protocol": "HTTP/1.1",
            "requestId": str(uuid.uuid4()),
            "requestTimeEpoch": int(time.time() * 1000),
            "identity": identity,
        },
        "body": body,
        "isBase64Encoded": False,
    }


def webhook_event(project_id: str, headers: dict[str, str], body: bytes) -> dict[str, Any]:
    """The API Gateway REST proxy event of a GitHub delivery to the webhook route."""
    return _api_event(
        "/webhooks/github/{project_id}",
        f"/webhooks/github/{project_id}",
        {"project_id": project_id},
        headers,
        body.decode("utf-8"),
        {"sourceIp": "192.0.2.1", "userAgent": "GitHub-Hookshot/bench"},
    )


def claim_event(region: str, body: dict[str, Any], caller_arn: str, route: str = "claims") -> dict[str, Any]:
    """The API Gateway REST proxy event of an agent's claim (POST /regions/{region}/claims), or of
    another of its region's routes (`route`: outcomes, heartbeats, accepts, sessions), as API
    Gateway sends it once the caller's SigV4 signature and execute-api:Invoke passed."""
    return _api_event(
        f"/regions/{{region}}/{route}",
        f"/regions/{region}/{route}",
        {"region": region},
        {"Content-Type": "application/json"},
        json.dumps(body),
        {"sourceIp": "192.0.2.1", "userAgent": "relevo-agent/bench", "userArn": caller_arn},
    )


# The role sessions of the warm execution environments (as_role(..., warm=True)), by role and service.
_WARM_SESSIONS: dict[tuple[str, str], Any] = {}


@contextmanager
def as_role(role_arn: str, service: str = "lambda.amazonaws.com", warm: bool = False) -> Iterator[None]:
    """This process's AWS calls made as a session of `role_arn`, as the AWS service that runs
    with that role would take it (the local stack's own role sessions). `warm`: as one execution
    environment of a function, invocation after invocation: Lambda hands an environment its role's
    credentials when it starts it, and its clients, built with them, serve every invocation it
    runs ("Lambda execution environment", AWS Lambda Developer Guide); so the same session each
    time, and the clients built with it kept (relevo_core.aws keys its clients by access key:
    another role's calls in between keep their own)."""
    from relevo_core.aws import reset_clients
    from relevo_local.identity import RoleSessions

    key = (role_arn, service)
    credentials = _WARM_SESSIONS.get(key) if warm else None
    if credentials is None:
        credentials = RoleSessions(os.environ.get("AWS_DEFAULT_REGION", "us-east-1")).credentials(
            role_arn, service, "bench"
        )
        if warm:
            _WARM_SESSIONS[key] = credentials
    saved = {
        name: os.environ.get(name)
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
    }
    os.environ.update(
        {
            "AWS_ACCESS_KEY_ID": credentials.access_key,
            "AWS_SECRET_ACCESS_KEY": credentials.secret_key,
            "AWS_SESSION_TOKEN": credentials.token,
        }
    )
    if not warm:
        reset_clients()
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        if not warm:
            reset_clients()


def github_headers(
    secret: str, body: bytes, event: str = "push", delivery: str | None = None, signature: str | None = None
) -> dict[str, str]:
    """A GitHub delivery's headers, signed with the project's secret unless `signature` is given."""
    from relevo_core.intake.webhooks.github import sign

    return {
        "Content-Type": "application/json",
        "User-Agent": "GitHub-Hookshot/bench",
        "X-GitHub-Event": event,
        "X-GitHub-Delivery": delivery or str(uuid.uuid4()),
        "X-Hub-Signature-256": signature or sign(secret, body),
    }


def push_body(repo: str, commit: str, ref: str = "refs/heads/main") -> bytes:
    """The same shape as tests/conftest.py push_body."""
    return json.dumps(
        {
            "ref": ref,
            "before": "1" * 40,
            "after": commit,
            "deleted": False,
            "repository": {"full_name": repo},
            "pusher": {"name": "ci"},
        }
    ).encode()


# ------------------------------------------------------------------------------------------------
# The summary `make bench` ends with

# Set by `make bench`: the JSON Lines file each bench's figures are appended to (bench/summary.py
# reads it). Unset (a bench run by hand): figures are only printed by the bench itself.
SUMMARY_FILE_ENV = "RELEVO_BENCH_SUMMARY"


def report(bench: str, figure: str, value: float | None, shown: str, target: str, ok: bool) -> None:
    """One figure of a bench for the summary table: its value (None: not a number, e.g. "equal"),
    how it reads (`shown`, with its unit), its target in words and whether it was met. The
    baseline beside it comes from bench/baselines.json, by bench and figure name."""
    path = os.environ.get(SUMMARY_FILE_ENV)
    if not path:
        return
    line = {
        "bench": bench,
        "figure": figure,
        "value": value,
        "shown": shown,
        "target": target,
        "ok": bool(ok),
    }
    with open(path, "a", encoding="utf-8") as out:
        out.write(json.dumps(line) + "\n")
