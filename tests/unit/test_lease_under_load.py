"""Issue 47, point 2: the lease keeper and the claim share no lock and no connection with what a
saturated Mac slows down, and the build runs below the agent's priority.

What starved a renewal on a busy host was never its own call: it was what the call waited for
first (the process's one lock for building clients, a connection another call had used) and a
build holding every core at the agent's own priority."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from botocore.credentials import Credentials

from relevo_agent.attempt import StageRun
from relevo_agent.claim_routes import ClaimRoutes
from relevo_agent.config import AgentConfig
from relevo_agent.executor import BUILD_NICE
from relevo_agent.journal import Journal
from relevo_agent.keeper import keep_lease
from relevo_agent.lease import Lease
from relevo_agent.service import Agent
from relevo_core import aws
from relevo_core.aws import JobCredentials, SessionCredentials, in_this_context, job_scope, own_lane
from relevo_core.fleet.lease_timeline import LeaseTimeline
from relevo_core.models.agent_session import HeartbeatRequest
from relevo_core.store import stage_attempts
from relevo_core.store.stage_attempts import StageRef
from tests.unit.test_executor import run

# Generous: a loaded CI machine may schedule a thread late. These tests prove what waits on
# what, never how fast.
SETTLE_SEC = 20


class _Answering:
    """An endpoint that answers every POST at once with `{}` over kept-alive connections, noting
    the path and the client's port (its connection) of each request."""

    def __init__(self) -> None:
        seen: list[tuple[str, int]] = []
        self.seen = seen

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive: a connection is reused when its pool offers it

            def do_POST(self) -> None:  # noqa: N802  (http.server's name)
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                seen.append((self.path, self.client_address[1]))
                body = b"{}"
                self.send_response(200)
                self.send_header("Content-Type", "application/x-amz-json-1.0")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture()
def answering(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Answering]:
    endpoint = _Answering()
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint.url)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAAGENTOWNKEY00000")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "agent-own-secret")
    aws.reset_clients()
    yield endpoint
    endpoint.close()
    aws.reset_clients()


def _job_credentials() -> JobCredentials:
    return JobCredentials(
        SessionCredentials(
            "ASIAJOBSESSION000000", "job-secret", "job-token", datetime.now(UTC) + timedelta(hours=1)
        )
    )


def test_a_renewal_is_not_held_back_by_a_client_another_thread_is_building(
    tmp_path: Path, answering: _Answering
):
    # Given an attempt just claimed (its job's session new: the first renewal builds its client),
    # and another thread of the agent building a client meanwhile (the log shipper's S3 client
    # for a large chunk loads botocore's endpoint table: seconds on a Mac whose cores the build
    # holds), i.e. holding the process's lock for building clients
    config = AgentConfig(
        agent_id="mac-busy", region="eu-west", workspace_root=tmp_path, journal=tmp_path / "j.sqlite3"
    )
    agent = Agent(config, "table", "http://127.0.0.1:1/queue", Journal(config.journal))
    timeline = LeaseTimeline(lease_ttl_sec=3, kill_grace_sec=1, max_clock_skew_sec=0.5)
    run_ = StageRun(StageRef("table", "job_x", 0, 1, "mac-busy"), Lease(timeline, time.monotonic()))
    renewed = threading.Event()
    run_.lease.watch(lambda _: renewed.set())
    with job_scope(_job_credentials()):
        keeper = threading.Thread(
            target=in_this_context(keep_lease),
            args=(run_, "job_x:build", agent.stop, agent.stages.claims.heartbeat),
            daemon=True,
        )
    try:
        with aws._lock:
            # When the renewal falls due while that client is still being built
            keeper.start()
            # Then it goes out and comes back on the keeper's own clients: the lease moves
            assert renewed.wait(SETTLE_SEC), "the renewal waited for another thread's client"
            assert any(path == "/" for path, _ in answering.seen)  # the UpdateItem went out
    finally:
        run_.done.set()
    keeper.join(SETTLE_SEC)
    assert not keeper.is_alive()


@pytest.mark.parametrize("lane", ["lease", "claim"])
def test_the_keeper_and_the_claim_never_reuse_a_connection_other_calls_left(answering: _Answering, lane: str):
    # Given the claim routes, over which an outcome or a session's renewal has gone (its
    # connection back in the pool: with retries off, a connection the other side has half
    # closed costs the next request its round)
    routes = ClaimRoutes(
        answering.url + "/v1", "eu-west", "us-east-1", credentials=lambda: Credentials("AKIAAGENT", "secret")
    )
    request = HeartbeatRequest(
        job_id="job_" + "0" * 26, stage_index=0, attempt=1, agent_id="mac-busy", claim_secret="a" * 64
    )
    routes.heartbeat(request)
    routes.heartbeat(request)
    shared = {port for _, port in answering.seen}
    assert len(shared) == 1  # the other calls share their pool's connection, as they should
    # When the lease keeper (or the claim) sends its request, in its lane
    with own_lane(lane):
        routes.heartbeat(request)
        routes.heartbeat(request)
    # Then it goes over a connection of its own, kept for its next one
    own = {port for _, port in answering.seen[2:]}
    assert len(own) == 1 and not own & shared


def test_the_build_runs_below_the_agents_priority(tmp_path: Path):
    # Given the agent at its own priority
    agent_nice = os.nice(0)
    chunks: list[bytes] = []
    # When a stage's command starts a process (as xcodebuild starts its compilers)
    result = run(
        'python3 -c "import os; print(os.nice(0))" & wait',
        tmp_path / "ws",
        chunks=chunks,
    )
    # Then that process runs BUILD_NICE below the agent (never above 19, nice(1)'s floor)
    assert result.exit_code == 0
    assert int(b"".join(chunks).decode().strip()) == min(19, agent_nice + BUILD_NICE) > agent_nice


def test_nice_keeps_the_pid_the_supervisor_was_told_of(tmp_path: Path):
    # Given a lease's dead-man supervisor, which learns the group from the wrapper's announced pid
    from relevo_agent.executor import run_command

    lease = Lease(LeaseTimeline(60, 1, 0.5), time.monotonic())
    started: list[int] = []
    chunks: list[bytes] = []
    # When the command runs (through nice(1), which execs it in its place)
    result = run_command(
        "echo $$",
        tmp_path / "ws",
        {"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
        20,
        threading.Event(),
        chunks.append,
        lease=lease,
        on_start=started.append,
    )
    # Then the shell that ran it is the process Popen started: the group the supervisor kills
    assert result.exit_code == 0
    assert json.loads(b"".join(chunks).decode()) == started[0]


def _due_run(tmp_path: Path) -> tuple[Agent, StageRun]:
    config = AgentConfig(
        agent_id="mac-busy", region="eu-west", workspace_root=tmp_path, journal=tmp_path / "j.sqlite3"
    )
    agent = Agent(config, "table", "http://127.0.0.1:1/queue", Journal(config.journal))
    timeline = LeaseTimeline(lease_ttl_sec=3, kill_grace_sec=1, max_clock_skew_sec=0.5)
    # Claimed one renew interval ago: the first renewal is due now.
    claimed = time.monotonic() - timeline.renew_interval_sec
    return agent, StageRun(StageRef("table", "job_x", 0, 1, "mac-busy"), Lease(timeline, claimed))


def test_a_renewal_refused_because_the_attempts_own_report_landed_is_no_lost_lease(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    # Given an attempt whose command ended and whose report is on its way (the stage record is
    # written `succeeded` by it), with a renewal sent just before the report was flagged
    agent, run_ = _due_run(tmp_path)
    sent = threading.Event()

    def renew_refused_by_the_report(*args: object, **kwargs: object) -> None:
        run_.reported = True  # the stage thread flags its report meanwhile
        sent.set()
        raise stage_attempts.LeaseLost("the stage record no longer holds a running attempt")

    monkeypatch.setattr(stage_attempts, "renew_lease", renew_refused_by_the_report)
    keeper = threading.Thread(
        target=keep_lease, args=(run_, "job_x:build", agent.stop, agent.stages.claims.heartbeat), daemon=True
    )
    # When the renewal comes back refused
    keeper.start()
    assert sent.wait(SETTLE_SEC)
    keeper.join(SETTLE_SEC)
    # Then the keeper ends quietly: the attempt is not stopped as a lease taken over
    assert not keeper.is_alive()
    assert run_.reason is None and not run_.cancel.is_set()


def test_a_reported_attempt_sends_no_more_renewals(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # Given an attempt whose report is on its way (its `lease_ended` ends the lease)
    agent, run_ = _due_run(tmp_path)
    run_.reported = True
    renewals: list[object] = []
    monkeypatch.setattr(stage_attempts, "renew_lease", lambda *args, **kwargs: renewals.append(args))
    # When its renewal falls due
    keeper = threading.Thread(
        target=keep_lease, args=(run_, "job_x:build", agent.stop, agent.stages.claims.heartbeat), daemon=True
    )
    keeper.start()
    keeper.join(SETTLE_SEC)
    # Then none is sent (it would only be refused) and the keeper has ended
    assert not keeper.is_alive() and renewals == []
    run_.done.set()
