"""boto3 clients, created on first use and reused for the life of the process.

Never built when this module is imported: cold start stays cheap and tests can point
AWS_ENDPOINT_URL at the embedded stack before the first call. A function whose first request is
on a latency path (the claim route) builds the clients it uses at its init (`ready_clients`), as
AWS recommends ("Initialize SDK clients ... outside of the function handler", Lambda Developer
Guide, Best practices for working with AWS Lambda functions).

Within `job_scope(credentials)` (the agent, for one stage attempt after its claim), the services a
job's session serves (JOB_SERVICES) are called with that session, every other one (SQS: the
region's queue) with the process's own credentials. A scope is a context variable: threads and
pools that work for the attempt start in a copy of the context (`in_this_context`). botocore itself honours
AWS_ENDPOINT_URL. A client is cached per endpoint, region and access key, so a process that points at a second
stack (a CLI call, an e2e module's own stack, each with credentials of its own) and back never keeps talking
to the one it left, nor with the credentials it used there.
"""

from __future__ import annotations

import contextvars
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from functools import cache, lru_cache
from typing import TYPE_CHECKING, Any, TypeVar

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

_CLIENT_CONFIG = Config(
    retries={"mode": "standard", "max_attempts": 3},
    connect_timeout=3,
    read_timeout=25,  # above SQS long-poll waits of 20 s
)
_lock = threading.Lock()

# The lane this thread's calls go through (see own_lane); None: the process's shared clients.
_LANE: ContextVar[str | None] = ContextVar("relevo_call_lane", default=None)
# Each lane's lock for building its clients (the shared clients' is `_lock`).
_LANE_LOCKS: dict[str, threading.Lock] = {}
_LANE_LOCKS_LOCK = threading.Lock()  # held for a dict insertion only, never while a client is built

# The monotonic deadline of this thread's calls (see call_budget); None: no deadline.
_DEADLINE: ContextVar[float | None] = ContextVar("relevo_call_deadline", default=None)
# Read timeouts a call's remaining time is rounded down to, so a few clients serve every deadline.
_READ_TIMEOUT_STEPS = (0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0)
# A connection on a healthy network takes milliseconds: a short connect timeout leaves the read
# most of the time, and a black-holed connect fails fast for the caller to try again.
_CONNECT_TIMEOUT_MAX = 1.0


@contextmanager
def call_budget(seconds: float) -> Iterator[None]:
    """Within the block, every call this thread makes ends before `seconds` from now are up:
    each client it gets makes one attempt per call (botocore's retries off: the caller retries
    while its deadline allows) with a connect and a read timeout that together fit in the time
    left when the client is taken ("Config", botocore: connect_timeout, read_timeout, retries
    total_max_attempts). For calls that must not outlast a deadline: the agent's lease path."""
    token = _DEADLINE.set(time.monotonic() + max(0.0, seconds))
    try:
        yield
    finally:
        _DEADLINE.reset(token)


@contextmanager
def own_lane(name: str) -> Iterator[None]:
    """Within the block, this thread's clients are the lane `name`'s own: built from a boto3 session
    of the lane's, under a lock of the lane's, each with its own HTTP connection pool (botocore
    keeps one per client). For calls that a busy process must not hold back: the agent's lease
    keeper and its claim. Without a lane, every client of the process is built under one lock
    (boto3 sessions are not thread-safe while they create clients), so a renewal that needs a
    client (the first of an attempt, the first after its job's session was renewed) would wait
    for whatever another thread is building meanwhile: the S3 client of a log body or an upload
    loads botocore's 1 MB endpoint table, seconds of CPU on a Mac whose cores the build holds."""
    token = _LANE.set(name)
    try:
        yield
    finally:
        _LANE.reset(token)


def _lane_lock(lane: str | None) -> threading.Lock:
    if lane is None:
        return _lock
    found = _LANE_LOCKS.get(lane)
    if found is None:
        with _LANE_LOCKS_LOCK:
            found = _LANE_LOCKS.setdefault(lane, threading.Lock())
    return found


# What a job's session may be used for (template.yaml JobPolicy); anything else keeps the process's
# own credentials, so an SQS call made while a stage runs is still the agent's.
JOB_SERVICES = frozenset({"dynamodb", "s3", "stepfunctions", "secretsmanager"})


@dataclass(frozen=True)
class SessionCredentials:
    access_key_id: str
    secret_access_key: str
    session_token: str
    expiration: datetime


class JobCredentials:
    """The current session of one stage attempt's job: replaced when it is renewed, its clients
    built on first use and dropped with the session they were built for."""

    def __init__(self, credentials: SessionCredentials) -> None:
        self._lock = threading.Lock()
        self._current = credentials
        self._clients: dict[tuple[Any, ...], Any] = {}

    @property
    def current(self) -> SessionCredentials:
        with self._lock:
            return self._current

    def replace(self, credentials: SessionCredentials) -> None:
        with self._lock:
            self._current = credentials
            self._clients.clear()

    def client(
        self,
        service: str,
        endpoint: str | None,
        region: str | None,
        timeouts: tuple[float, float] | None,
        lane: str | None = None,
    ) -> Any:
        with self._lock:
            credentials = self._current
            cache_key = (service, endpoint, region, timeouts, lane)
            found = self._clients.get(cache_key)
        if found is not None:
            return found
        config = _CLIENT_CONFIG
        if timeouts is not None:
            config = config.merge(
                Config(
                    connect_timeout=timeouts[0],
                    read_timeout=timeouts[1],
                    retries={"mode": "standard", "total_max_attempts": 1},
                )
            )
        with _lane_lock(lane):
            with self._lock:  # another thread may have built it while this one waited for the lock
                found = self._clients.get(cache_key) if self._current is credentials else None
            if found is not None:
                return found
            built = _new_client(
                _session(_environment()[2], _lean(service), lane),
                service,
                config=config,
                aws_access_key_id=credentials.access_key_id,
                aws_secret_access_key=credentials.secret_access_key,
                aws_session_token=credentials.session_token,
            )
        with self._lock:
            if self._current is credentials:
                self._clients.setdefault(cache_key, built)
        return built


_JOB: ContextVar[JobCredentials | None] = ContextVar("relevo_job_credentials", default=None)


@contextmanager
def job_scope(credentials: JobCredentials | None) -> Iterator[None]:
    """Within the block (and in the threads started with `in_this_context`), JOB_SERVICES are
    called with the job's session."""
    token = _JOB.set(credentials)
    try:
        yield
    finally:
        _JOB.reset(token)


_T = TypeVar("_T")

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor


def ready_clients(*services: str) -> None:
    """Build now the clients of `services` that `client` would build on first use, and the
    side-by-side pool (a Lambda function's init: its first request then pays none of it; some
    20 ms of CPU per client)."""
    for service in services:
        client(service)
    side_by_side()


_SIDE_BY_SIDE: ThreadPoolExecutor | None = None


def side_by_side() -> ThreadPoolExecutor:
    """The process's pool for calls made side by side on one request's path (the claim route's
    reads, then its claim beside the job's session): its threads outlive the request, so none is
    started on the path (each start waits for the new thread to run: milliseconds on a busy
    host, four per claim). A task never waits for another task of this pool."""
    global _SIDE_BY_SIDE
    if _SIDE_BY_SIDE is None:
        # Imported with the pool's first use (at a claim function's init, `ready_clients`): a
        # function that never reads side by side, the webhook's, does not load it.
        from concurrent.futures import ThreadPoolExecutor

        with _lock:
            if _SIDE_BY_SIDE is None:
                _SIDE_BY_SIDE = ThreadPoolExecutor(max_workers=8, thread_name_prefix="side-by-side")
    return _SIDE_BY_SIDE


def in_this_context(target: Callable[..., _T]) -> Callable[..., _T]:
    """`target`, to run on another thread in a copy of this thread's context: the job's session
    and call budget it works under (threads do not inherit context variables)."""
    context = contextvars.copy_context()
    # A copy per call: one context cannot be entered by two threads at once (a pool's workers).
    return lambda *args, **kwargs: context.copy().run(target, *args, **kwargs)


def call_lane() -> str | None:
    """The lane this thread's calls go through (own_lane), None: the shared one; for calls made
    without a boto3 client, which keep a connection pool per lane too (the agent's claim routes)."""
    return _LANE.get()


def call_time_left() -> float | None:
    """Seconds left in this thread's call budget (None: no budget): for calls made without a
    boto3 client, such as the agent's signed requests to the claim routes."""
    deadline = _DEADLINE.get()
    return None if deadline is None else deadline - time.monotonic()


def _environment() -> tuple[str | None, str | None, str | None]:
    return (
        os.environ.get("AWS_ENDPOINT_URL"),
        os.environ.get("AWS_DEFAULT_REGION"),
        os.environ.get("AWS_ACCESS_KEY_ID"),
    )


def client(service: str) -> Any:
    endpoint, region, access_key = _environment()
    deadline = _DEADLINE.get()
    lane = _LANE.get()
    job = _JOB.get() if service in JOB_SERVICES else None
    if job is not None:
        return job.client(
            service,
            endpoint,
            region,
            _timeouts(deadline - time.monotonic()) if deadline is not None else None,
            lane,
        )
    if deadline is not None:
        connect, read = _timeouts(deadline - time.monotonic())
        return _bounded_client(service, endpoint, region, access_key, connect, read, lane)
    return _client(service, endpoint, region, access_key, lane)


def _timeouts(left: float) -> tuple[float, float]:
    """(connect, read) for a call that has `left` seconds, the read rounded down to a step."""

    def step(seconds: float) -> float:
        return max([s for s in _READ_TIMEOUT_STEPS if s <= seconds], default=_READ_TIMEOUT_STEPS[0])

    connect = min(_CONNECT_TIMEOUT_MAX, step(left / 4))
    return connect, step(left - connect)


# Clients built so far, by what they were built from (the key carries the environment the client
# was built from; boto3 reads it again itself).
_CLIENTS: dict[tuple[Any, ...], Any] = {}


def _built_once(key: tuple[Any, ...], build: Callable[[], Any], lane: str | None = None) -> Any:
    """The client of `key`, built by the first thread that asks for it. boto3 sessions are not
    thread-safe while they create clients: one lock for all creation, and a thread that waited
    for it takes what the thread before it built (two threads of one claim asking for the same
    client at once built it twice: some 10 ms of CPU each, on the claim's path)."""
    found = _CLIENTS.get(key)
    if found is not None:
        return found
    with _lock:
        found = _CLIENTS.get(key)
        if found is None:
            found = _CLIENTS[key] = build()
        return found


def _bounded_client(
    service: str,
    endpoint: str | None,
    region: str | None,
    access_key: str | None,
    connect: float,
    read: float,
    lane: str | None = None,
) -> Any:
    def build() -> Any:
        config = _CLIENT_CONFIG.merge(
            Config(
                connect_timeout=connect,
                read_timeout=read,
                retries={"mode": "standard", "total_max_attempts": 1},
            )
        )
        return _new_client(_session(access_key, _lean(service), lane), service, config=config)

    return _built_once(("bounded", service, endpoint, region, access_key, connect, read), build, lane)


def _client(
    service: str, endpoint: str | None, region: str | None, access_key: str | None, lane: str | None = None
) -> Any:
    return _built_once(
        (service, endpoint, region, access_key),
        lambda: _new_client(_session(access_key, _lean(service), lane), service, config=_CLIENT_CONFIG),
        lane,
    )


# Set by a process that creates its clients without botocore's table of every service's endpoints
# (lean_endpoints): the agent, whose idle memory is a budget.
_LEAN_ENDPOINTS = False
# S3 keeps the table: its client takes its region from it ("A region must be set when sending
# requests to S3" without), and it is created only once an attempt uploads or restores something.
_NEEDS_ENDPOINTS_TABLE = frozenset({"s3"})


def lean_endpoints() -> None:
    """This process's clients (but S3's) do without botocore's endpoints.json, the table of every
    service's endpoints in every partition: about 6 MB in memory (1 MB of JSON) of an idle agent's
    55 MB budget, of which it uses nothing. A client's URL still comes from its service's rule set
    (endpoint-rule-set-1.json) as for every client; its signing name, region and signature version
    are found as botocore finds them for a service that table does not list
    (ClientEndpointBridge._assume_endpoint: the service model's signing name, the client's region,
    SigV4). tests/unit/test_aws_clients.py holds every request the agent makes of each service,
    in every partition, to what the full table gives. Only the agent's own process sets this."""
    global _LEAN_ENDPOINTS
    _LEAN_ENDPOINTS = True
    reset_clients()


def _lean(service: str) -> bool:
    return _LEAN_ENDPOINTS and service not in _NEEDS_ENDPOINTS_TABLE


def _new_client(session: boto3.session.Session, service: str, **settings: Any) -> Any:
    return session.client(service, **settings)  # type: ignore[call-overload]  # stubs: literal names only


@lru_cache(maxsize=8)
def _session(access_key: str | None, lean: bool = False, lane: str | None = None) -> boto3.session.Session:
    """One session for every client of a set of credentials (a session keeps the credentials it
    resolved first): each session loads botocore's endpoint and retry data again, about 8 MB per
    client in an agent that keeps four (the agent's idle RSS budget). A lane (own_lane) has its
    own, built the first time the lane builds a client (an idle agent builds none)."""
    session = boto3.session.Session()
    if lean:
        from botocore.regions import EndpointResolver

        register = getattr(session._session, "_register_internal_component", None)
        if register is not None:  # a botocore without it: the whole table, as any process has it
            # No partition, no service listed: botocore assumes each endpoint (see lean_endpoints).
            register("endpoint_resolver", EndpointResolver({"partitions": []}, uses_builtin_data=True))
    return session


def aws_region() -> str:
    """The AWS region this process's calls go to (its environment or AWS profile)."""
    return str(_session(_environment()[2], _LEAN_ENDPOINTS).region_name or "us-east-1")


def process_credentials() -> Any:
    """The process's own credentials, frozen (botocore ReadOnlyCredentials; refreshed first when
    they are about to expire), for what signs its own requests: the agent's calls of the claim
    routes. None when there are none."""
    found = _session(_environment()[2], _LEAN_ENDPOINTS).get_credentials()
    return None if found is None else found.get_frozen_credentials()


def s3_presigner() -> Any:
    """An S3 client for presigned URLs of the artifact bucket (the stack's own, in this process's
    region), cached like the others. SigV4 always: S3 refuses other signatures for objects
    encrypted with KMS, as the artifact bucket's are.

    On AWS a link names the bucket's regional virtual-hosted endpoint,
    `https://<bucket>.s3.<region>.amazonaws.com/...` (us-east-1's too), and its signature that
    region: botocore would otherwise presign the legacy global endpoint `<bucket>.s3.amazonaws.com`,
    which S3 answers for a new bucket with a 307 redirect to its region, and for a bucket of a
    region launched after March 20, 2019 (ap-east-1, me-south-1, af-south-1...) with 400 Bad Request
    ("Virtual hosting of buckets", "Request routing", Amazon S3 User Guide); and the host is signed,
    so a link cannot be moved to another host once made. botocore's endpoint rules name each
    partition's host (amazonaws.com.cn in China). Locally (AWS_ENDPOINT_URL) the link names the
    emulator, path-style, as before."""
    return _presigner(*_environment())


@cache
def _presigner(endpoint: str | None, region: str | None, access_key: str | None) -> Any:
    config = _CLIENT_CONFIG.merge(
        Config(
            signature_version="s3v4",
            s3={"us_east_1_regional_endpoint": "regional", "addressing_style": "virtual"}
            if endpoint is None
            else {"us_east_1_regional_endpoint": "regional"},
        )
    )
    with _lock:
        return _session(access_key).client("s3", config=config)


def reset_clients() -> None:
    """Forget cached clients and their session (after credentials change)."""
    with _lock:
        _CLIENTS.clear()
    _session.cache_clear()
    _presigner.cache_clear()


def error_code(exc: ClientError) -> str:
    """The error code AWS refused a call with ("" when its answer named none)."""
    return str(exc.response.get("Error", {}).get("Code", ""))


def error_words(exc: BaseException) -> str:
    """What went wrong, for a person: a refused AWS call as its code and message, anything else
    (no answer, a bad profile) as its own words."""
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        return f"{error.get('Code', 'error')}: {error.get('Message', '')}".strip(": ")
    return str(exc)
