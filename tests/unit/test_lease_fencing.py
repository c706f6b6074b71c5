"""Issue 14, points 1 and 2: the holder's lease deadline is kept on a monotonic clock no network
call can block, and a dead-man supervisor outside the agent's interpreter kills the stage's
process group when the deadline passes unextended, even while the agent is frozen."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from relevo_agent.attempt import StageRun
from relevo_agent.config import AgentConfig
from relevo_agent.executor import run_command
from relevo_agent.journal import Journal
from relevo_agent.keeper import keep_fence, keep_lease
from relevo_agent.lease import Lease
from relevo_agent.service import Agent
from relevo_agent.supervisor import group_alive
from relevo_core.aws import reset_clients
from relevo_core.fleet.lease_timeline import LeaseTimeline
from relevo_core.store import stage_attempts
from relevo_core.store.stage_attempts import StageRef


def _gone(pgid: int) -> bool:
    return not group_alive(pgid, zombies_are_dead=True)


def _wait(check: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return check()


def _read_pid(path: Path, timeout: float = 10) -> int:
    assert _wait(lambda: path.exists() and path.read_text().strip().isdigit(), timeout), (
        "the stage never started"
    )
    return int(path.read_text())


def test_the_timeline_of_the_issue_and_of_the_defaults():
    defaults = LeaseTimeline(60, 10, 5)
    assert (
        defaults.renew_interval_sec,
        defaults.fence_margin_sec,
        defaults.fence_after_sec,
        defaults.kill_after_sec,
    ) == (3, 15, 45, 55)
    assert (defaults.successor_claim_after_sec, defaults.successor_probe_after_sec) == (60, 65)
    # A lease too short for the whole grace gets what is left of it; the group still dies `skew`
    # before the lease ends, and two renewals fit before the fence.
    short = LeaseTimeline(6, 10, 1)
    assert short.kill_after_sec == 6 - 1 and short.fence_after_sec >= 2 * short.renew_interval_sec
    assert not LeaseTimeline(3, 1, 5).feasible  # the skew alone outlasts the lease


def test_a_lease_moves_only_forward_and_from_the_send_time_of_a_renewal():
    now = [100.0]
    lease = Lease(LeaseTimeline(6, 1, 1), sent_at=100.0, clock=lambda: now[0])
    seen: list[float] = []
    lease.watch(lambda renewed: seen.append(renewed.fence_at))
    assert lease.fence_at == 104.0
    now[0] = 103.0
    assert lease.extend(sent_at=102.0)  # sent at 102, came back at 103: counts from 102
    assert lease.fence_at == 106.0 and seen == [106.0]
    assert not lease.extend(sent_at=101.0)  # an older renewal coming back late changes nothing
    assert lease.fence_at == 106.0 and not lease.fenced()
    now[0] = 106.0
    assert lease.fenced()


@pytest.fixture()
def black_hole(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """AWS as a partitioned agent sees it: connections are accepted, nothing ever answers."""
    listener = socket.create_server(("127.0.0.1", 0))
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{listener.getsockname()[1]}")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    reset_clients()
    yield listener.getsockname()
    listener.close()
    reset_clients()


def _renewing_run(tmp_path: Path, timeline: LeaseTimeline) -> tuple[Agent, StageRun, float]:
    config = AgentConfig(
        agent_id="mac-cut", region="eu-west", workspace_root=tmp_path, journal=tmp_path / "j.sqlite3"
    )
    agent = Agent(config, "table", "http://127.0.0.1:1/queue", Journal(config.journal))
    claimed = time.monotonic()
    run = StageRun(StageRef("table", "job_x", 0, 1, "mac-cut"), Lease(timeline, claimed))
    run.token_known.set()  # renewing: the phase in which the partition came
    run.run_handed = True
    return agent, run, claimed


def _start(agent: Agent, run: StageRun) -> tuple[threading.Thread, threading.Thread]:
    keeper = threading.Thread(
        target=keep_lease, args=(run, "job_x:build", agent.stop, agent.stages.claims.heartbeat), daemon=True
    )
    fence = threading.Thread(target=keep_fence, args=(run, "job_x:build"), daemon=True)
    keeper.start()
    fence.start()
    return keeper, fence


# Generous on purpose: a loaded CI machine may schedule a thread late. What these tests prove is
# what happens and in which order, never how fast (the drills measure that).
SETTLE_SEC = 30


def test_the_fence_fires_while_a_renewal_still_hangs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The partition of the issue: the renewal call never comes back. The keeper used to wait out
    the SDK's 25 s read timeout, three times, before it looked at its deadline; the fence is now
    a thread of its own, so a call that hangs for ever cannot hold it."""
    hung, release = threading.Event(), threading.Event()

    def renew_that_hangs(*args, **kwargs):
        hung.set()
        release.wait()  # a call no budget bounds: only the fence can end this stage
        raise stage_attempts.LeaseLost("released at the end of the test")

    monkeypatch.setattr(stage_attempts, "renew_lease", renew_that_hangs)
    timeline = LeaseTimeline(lease_ttl_sec=3, kill_grace_sec=1, max_clock_skew_sec=0.5)
    agent, run, claimed = _renewing_run(tmp_path, timeline)
    keeper, _ = _start(agent, run)
    try:
        assert hung.wait(SETTLE_SEC), "the keeper never renewed"
        assert run.cancel.wait(SETTLE_SEC), "the fence never fired"
        fenced_after = time.monotonic() - claimed
        assert run.reason == "fenced"
        assert not release.is_set() and keeper.is_alive()  # the renewal was still hanging
        assert fenced_after >= timeline.fence_after_sec  # and the fence did not come early
    finally:
        run.done.set()
        release.set()
    keeper.join(SETTLE_SEC)
    assert not keeper.is_alive()


def test_a_black_holed_renewal_ends_within_the_time_left(tmp_path: Path, black_hole):
    """Every renewal is black-holed (connections accepted, nothing answers). The keeper's call is
    bounded by the time left before the fence, so the keeper ends on its own after the fence."""
    timeline = LeaseTimeline(lease_ttl_sec=3, kill_grace_sec=1, max_clock_skew_sec=0.5)
    agent, run, claimed = _renewing_run(tmp_path, timeline)
    keeper, fence = _start(agent, run)
    assert run.cancel.wait(SETTLE_SEC)
    assert run.reason == "fenced"
    assert run.lease.deadline == claimed + timeline.lease_ttl_sec  # nothing came back to extend it
    # Not done: the keeper ends because its own call gave up at the fence, not because it was told.
    keeper.join(SETTLE_SEC)
    fence.join(SETTLE_SEC)
    assert not keeper.is_alive() and not fence.is_alive()
    run.done.set()


def test_the_supervisor_kills_the_group_at_the_fence_when_nobody_extends_the_lease(tmp_path: Path):
    pid_file, late = tmp_path / "pid", tmp_path / "late"
    lease = Lease(LeaseTimeline(lease_ttl_sec=3, kill_grace_sec=1, max_clock_skew_sec=0.5), time.monotonic())
    started = time.monotonic()
    # The agent here never notices (its own stop is not set): only the supervisor acts.
    result = run_command(
        f"echo $$ > {pid_file}; trap '' TERM; sleep 10; touch {late}",
        tmp_path,
        {"PATH": os.environ["PATH"]},
        60,
        threading.Event(),
        lambda chunk: None,
        grace_sec=1,
        lease=lease,
    )
    took = time.monotonic() - started
    assert result.signaled == signal.SIGKILL  # TERM was ignored, KILL came after the fence grace
    assert took >= lease.timeline.kill_after_sec  # not before the fence and its grace
    assert lease.fenced(result.ended_at)
    assert not late.exists()  # the effect, 10 s in, never happened


def test_extensions_keep_the_supervisor_from_killing(tmp_path: Path):
    lease = Lease(LeaseTimeline(lease_ttl_sec=3, kill_grace_sec=1, max_clock_skew_sec=0.5), time.monotonic())
    renewing = threading.Event()

    def renew() -> None:
        while not renewing.wait(0.5):
            lease.extend(time.monotonic())

    threading.Thread(target=renew, daemon=True).start()
    try:
        result = run_command(
            "sleep 4; echo finished",
            tmp_path,
            {"PATH": os.environ["PATH"]},
            60,
            threading.Event(),
            lambda c: None,
            lease=lease,
        )
    finally:
        renewing.set()
    assert (result.exit_code, result.output_tail) == (0, "finished\n")  # 4 s > the 2 s fence of one lease


_FROZEN_AGENT = """
import os, pathlib, sys, threading, time
from relevo_agent.executor import run_command
from relevo_agent.lease import Lease
from relevo_core.fleet.lease_timeline import LeaseTimeline
lease = Lease(LeaseTimeline(lease_ttl_sec=3, kill_grace_sec=1, max_clock_skew_sec=0.5), time.monotonic())
def renew():
    while True:
        time.sleep(0.5)
        lease.extend(time.monotonic())
threading.Thread(target=renew, daemon=True).start()
run_command(
    sys.argv[1], pathlib.Path(sys.argv[2]), {"PATH": os.environ["PATH"]}, 60, threading.Event(),
    lambda c: None, lease=lease,
)
"""


def test_a_frozen_agents_stage_is_killed_by_its_supervisor(tmp_path: Path):
    """SIGSTOP of the agent's pid alone: the agent extends nothing any more, its supervisor runs
    on (a process of its own, in a session of its own) and kills the group at the fence."""
    pid_file, late = tmp_path / "pid", tmp_path / "late"
    agent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(_FROZEN_AGENT),
            f"echo $$ > {pid_file}; sleep 8; touch {late}",
            str(tmp_path),
        ],
        start_new_session=True,
    )
    try:
        stage = _read_pid(pid_file)
        time.sleep(1.0)  # renewing: alive past its first fence
        assert not _gone(stage)
        os.kill(agent.pid, signal.SIGSTOP)
        frozen = time.monotonic()
        # The effect lands 8 s after the stage started; the fence is 2 s after the last extension.
        assert _wait(lambda: _gone(stage), 6), "the stage outlived its frozen agent's lease"
        assert time.monotonic() - frozen >= 1.0  # not before the fence of the last extension
    finally:
        os.kill(agent.pid, signal.SIGCONT)
        agent.kill()
        agent.wait()
    time.sleep(0.2)
    assert not late.exists()


def test_the_task_is_heartbeaten_every_third_of_the_lease_while_the_lease_is_renewed_every_3_s():
    # Given the default lease (60 s: HeartbeatSeconds too) renewed every 3 s
    timeline = LeaseTimeline(60, 10, 5)
    # When a keeper renews from the run token's handing on, heartbeating when one is due
    beats, last = [], None
    for renewal in range(1, 41):
        sent = 3.0 * renewal
        if timeline.heartbeat_due(last, sent):
            beats.append(sent)
            last = sent
    # Then the task is heartbeaten every 7th renewal (21 s), not every one: 1,000 stages send
    # 1000 / 21 = 48 SendTaskHeartbeat a second, over 10x under the 500/s quota (bench/scale.py),
    # and every gap stays far inside HeartbeatSeconds
    assert timeline.heartbeat_interval_sec == 20
    assert beats == [3.0, 24.0, 45.0, 66.0, 87.0, 108.0]
    assert max(b - a for a, b in zip(beats, beats[1:], strict=False)) <= timeline.lease_ttl_sec / 2
    # and a short lease heartbeats with each renewal, as before (lease/3 is its renewal interval)
    short = LeaseTimeline(6, 1, 1)
    assert short.heartbeat_interval_sec == short.renew_interval_sec == 2
    assert short.heartbeat_due(10.0, 12.0) and not short.heartbeat_due(10.0, 11.0)


@pytest.mark.parametrize(
    ("code", "status", "reason"),
    [
        ("ATTEMPT_ENDED", "canceled", "canceled"),  # a sibling shard failed, or the job was canceled
        ("ATTEMPT_ENDED", "running", "lease_lost"),  # it ran out of lease on the record
        ("ATTEMPT_NOT_HELD", None, "lease_lost"),  # another claim holds the attempt
    ],
)
def test_a_heartbeat_refused_after_its_renewal_came_back_stops_the_stage_as_the_refusal_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: str, status: str | None, reason: str
):
    """The attempt was canceled between a round's renewal (which came back: the record was still
    live) and its heartbeat (which the route refused, 409 ATTEMPT_ENDED with the record's status).
    That is the ending a renewal one moment later would have said, `canceled`, not a lost lease:
    a fail-fast sibling's agent said either, by which call saw the cancel first (an e2e run)."""
    from relevo_agent.claim_routes import RouteError

    monkeypatch.setattr(stage_attempts, "renew_lease", lambda *args, **kwargs: None)
    timeline = LeaseTimeline(lease_ttl_sec=30, kill_grace_sec=1, max_clock_skew_sec=0.5)
    agent, run, _ = _renewing_run(tmp_path, timeline)

    def refused(_: StageRun) -> None:
        raise RouteError(409, code, "refused", {"status": status} if status else None)

    keeper = threading.Thread(target=keep_lease, args=(run, "job_x:build", agent.stop, refused), daemon=True)
    keeper.start()
    keeper.join(SETTLE_SEC)
    assert not keeper.is_alive()
    assert run.reason == reason
    run.done.set()
