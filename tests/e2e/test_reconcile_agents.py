"""Reconcile before retry, the journal and staged shutdown, with real relevo-agent processes on
`relevo local up`: agents SIGKILLed mid-stage, cut off from AWS by a proxy the test controls,
restarted, signaled; the effect file every stage appends to shows what really ran."""

from __future__ import annotations

import json
import os
import secrets
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from relevo_cli.api import ApiError, RelevoApi
from relevo_core.files.stack import StackInfo
from relevo_core.store import agents
from relevo_local.processes import agent_process
from relevo_tools.drill.proxy import FaultProxy, Mode
from tests.helpers.payloads import push_body
from tests.helpers.stack import deliver, regions_of, register_project

# One worker runs the module: the stack it shares is started on that worker only.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300), pytest.mark.xdist_group("e2e-reconcile")]

# A killed agent's attempt lapses after this; so does a live one's, should its heartbeats not reach
# the local stack for as long. At 3 s, the live retry's lease lapsed in three of four whole runs on
# a loaded 2-core host (its attempts log: attempt 2 "stopped heartbeating" 6-8 s after attempt 1).
LEASE = 8


@pytest.fixture(scope="module")
def stack(shared_stack: tuple[StackInfo, Path]) -> Iterator[StackInfo]:
    with regions_of(shared_stack, ("eu-west",)) as (info, _):
        yield info


class Fleet:
    """Agent configs and processes of one test, all in its tmp_path."""

    def __init__(self, stack: StackInfo, tmp_path: Path, project_id: str) -> None:
        self.stack = stack
        self.tmp = tmp_path
        self.project_id = project_id
        self.api = RelevoApi.for_stack(stack)
        self.effect = tmp_path / "effect.log"
        self.effect.touch()
        self.started = tmp_path / "started"
        self.stack_file = tmp_path / "stack.json"
        self.stack_file.write_text(stack.model_dump_json())
        self.jobs: list[str] = []

    def config(
        self,
        agent_id: str,
        workspace_root: Path | None = None,
        stack_file: Path | None = None,
        mac: str | None = None,
    ) -> Path:
        """`mac`: the Mac the agent runs on, when it is not the agent_id (a cloned image)."""
        mac = mac or agent_id
        path = self.tmp / f"{mac}.toml"
        path.write_text(
            "\n".join(
                [
                    f'agent_id = "{self.agent_id(agent_id)}"',
                    'region = "eu-west"',
                    "capacity = 1",
                    f'workspace_root = "{workspace_root or self.tmp / (mac + "-ws")}"',
                    f'journal = "{self.journal(mac)}"',
                    f'stack_file = "{stack_file or self.stack_file}"',
                    "poll_wait_sec = 1",
                    "outbox_interval_sec = 0.5",
                    "presence_interval_sec = 2",  # a SIGKILLed Mac looks offline after 6 s
                    "max_clock_skew_sec = 0.5",  # one host's clock: a 3 s lease leaves room to renew
                    "",
                ]
            )
        )
        return path

    def agent_id(self, name: str) -> str:
        """The agent_id of this test's Mac `name`: each test has Macs of its own (a Mac that was
        SIGKILLed in one test still looks online for a while to the next one's)."""
        return f"{name}-{self.project_id[-8:]}"

    @property
    def probe(self) -> str:
        """The effect probe: present (exit 0) when the effect file has a line naming the operation."""
        return f'grep -F "$RELEVO_OPERATION_ID" {self.effect}'

    def journal(self, agent_id: str) -> Path:
        return self.tmp / f"{agent_id}-journal.sqlite3"

    @contextmanager
    def agent(self, agent_id: str, **config: Any) -> Iterator[subprocess.Popen[bytes]]:
        with agent_process(self.config(agent_id, **config), self.tmp / f"{agent_id}.log") as process:
            yield process

    def log(self, agent_id: str) -> str:
        path = self.tmp / f"{agent_id}.log"
        return path.read_text() if path.exists() else ""

    def register(self, build: str, probe: str | None = None, **project: Any) -> str:
        stage: dict[str, Any] = {"name": "build", "run": build, "exec_timeout_sec": 120, "kill_grace_sec": 1}
        if probe:
            stage["effect_probe"] = probe
        upload = {
            "name": "upload",
            "run": f'echo "$RELEVO_OPERATION_ID" >> {self.effect}',
            "kill_grace_sec": 1,
        }
        settings = {
            "lease_ttl_sec": LEASE,
            "queue_timeout_sec": 120,
            "retry": {"backoff_base_sec": 0},
            **project,
        }
        return register_project(self.stack, self.project_id, [stage, upload], **settings)

    def push(self, secret: str) -> str:
        response = deliver(
            self.stack, self.project_id, push_body(f"acme/{self.project_id}", secrets.token_hex(20)), secret
        )
        assert response.status_code == 202, response.text
        self.jobs.append(response.json()["job_id"])
        return self.jobs[-1]

    def cancel_unfinished(self) -> None:
        """The stack and its region queue are shared by the module's tests: a job a test leaves
        running (its agent gone) must not be picked up by the next test's agents, and a Mac it
        SIGKILLed (whose presence still looks online) must not be offered the next test's retries."""
        for job_id in self.jobs:
            try:
                if self.api.get_job(job_id)["status"] not in ("succeeded", "failed", "canceled"):
                    self.api.cancel_job(job_id)
            except ApiError:
                pass
        for name in ("mac-a", "mac-b"):
            agents.mark_offline(self.stack.table_name, "eu-west", self.agent_id(name), datetime.now(UTC))

    def wait_started(self, count: int = 1, timeout: float = 60) -> None:
        wait_until(
            lambda: self.started.exists() and len(self.started.read_text().split()) >= count,
            timeout,
            "stage start",
        )

    def wait_job(
        self, job_id: str, until: Callable[[dict[str, Any]], bool] | None = None, timeout: float = 120
    ) -> dict[str, Any]:
        done = until or (lambda job: job["status"] in ("succeeded", "failed", "canceled"))
        holder: dict[str, Any] = {}

        def check() -> bool:
            holder["job"] = self.api.get_job(job_id)
            return done(holder["job"])

        wait_until(check, timeout, f"job {job_id}", lambda: json.dumps(holder.get("job"), indent=1)[-3000:])
        return holder["job"]

    def effect_lines(self) -> list[str]:
        return self.effect.read_text().splitlines()


def wait_until(
    check: Callable[[], bool], timeout: float, what: str, detail: Callable[[], str] = lambda: ""
) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached within {timeout}s {detail()}")
        time.sleep(0.2)


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.fixture()
def fleet(stack: StackInfo, tmp_path: Path) -> Iterator[Fleet]:
    fleet = Fleet(stack, tmp_path, "e2e-" + secrets.token_hex(4))
    yield fleet
    fleet.cancel_unfinished()


def _kill_mid_build(
    fleet: Fleet, build: str, probe: str | None, **agent_b: Any
) -> tuple[str, dict[str, Any]]:
    """mac-a starts the build and is SIGKILLed mid-stage; mac-b takes the retry."""
    secret = fleet.register(build, probe)
    with fleet.agent("mac-a") as mac_a:
        job_id = fleet.push(secret)
        fleet.wait_started()
        mac_a.kill()  # SIGKILL: no handler runs; the stage's watchdog kills its process group
        mac_a.wait()
    with fleet.agent("mac-b", **agent_b):
        job = fleet.wait_job(job_id)
    return job_id, job


def test_a_sigkilled_agents_stage_is_reconciled_and_runs_again_on_the_other_agent(fleet: Fleet):
    job_id, job = _kill_mid_build(
        fleet,
        build=f'echo "$RELEVO_ATTEMPT" >> {fleet.started}; sleep 2; echo "$RELEVO_OPERATION_ID" >> '
        f"{fleet.effect}",
        probe=fleet.probe,
    )

    assert job["status"] == "succeeded", fleet.log("mac-b")[-3000:]
    # Exactly one line per completed stage: the killed attempt left nothing, the retry ran once.
    assert fleet.effect_lines() == [f"{job_id}:build", f"{job_id}:upload"]
    build = job["stages"][0]
    # Its attempts log says why, should a later attempt than 2 have run (a lapse on a stalled host).
    assert (build["status"], build["agent_id"], build["attempt"]) == (
        "succeeded",
        fleet.agent_id("mac-b"),
        2,
    ), build.get("attempts_log")
    assert [entry["error"] for entry in build["attempts_log"]] == ["Relevo.Lease.Expired"]
    assert build["reconciled"]["decision"] == "rerun"
    assert build["reconciled"]["evidence"]["probe_exit"] == 1
    assert build["reconciled"]["evidence"]["previous_agent"] == fleet.agent_id("mac-a")


def test_an_effect_the_probe_finds_is_reconciled_as_succeeded_and_not_run_again(fleet: Fleet):
    job_id, job = _kill_mid_build(
        fleet,
        # The effect lands, then the agent dies before the command ends.
        build=f'echo "$RELEVO_OPERATION_ID" >> {fleet.effect}; echo "$RELEVO_ATTEMPT" >> {fleet.started}; '
        "sleep 60",
        probe=fleet.probe,
    )

    assert job["status"] == "succeeded", fleet.log("mac-b")[-3000:]
    assert fleet.effect_lines() == [f"{job_id}:build", f"{job_id}:upload"]
    assert fleet.started.read_text().split() == ["1"]  # attempt 2 never ran the command
    build = job["stages"][0]
    assert (build["status"], build["attempt"], build["reconciled"]["decision"]) == (
        "succeeded",
        2,
        "succeeded",
    )
    assert build["reconciled"]["evidence"]["probe_exit"] == 0


def test_a_moved_ref_stops_with_precondition_changed(fleet: Fleet):
    shared = fleet.tmp / "shared-ws"
    repo = shared / fleet.project_id
    repo.mkdir(parents=True)

    def git(*args: str) -> None:
        subprocess.run(
            ["git", "-C", str(repo), "-c", "user.email=ci@acme", "-c", "user.name=ci", *args],
            check=True,
            capture_output=True,
        )

    git("init", "-q", "-b", "main")
    git("commit", "-q", "--allow-empty", "-m", "release 41")
    secret = fleet.register(
        f'echo "$RELEVO_ATTEMPT" >> {fleet.started}; sleep 60; echo "$RELEVO_OPERATION_ID" >> {fleet.effect}'
    )
    with fleet.agent("mac-a", workspace_root=shared) as mac_a:
        job_id = fleet.push(secret)
        fleet.wait_started()
        mac_a.kill()
        mac_a.wait()
    git("commit", "-q", "--allow-empty", "-m", "release 42")  # main moves while the outcome is unknown
    with fleet.agent("mac-b", workspace_root=shared):
        job = fleet.wait_job(job_id)

    assert (job["status"], job["error"]) == ("failed", "Relevo.Precondition.Changed"), fleet.log("mac-b")[
        -3000:
    ]
    build = job["stages"][0]
    assert build["reconciled"]["decision"] == "precondition_changed"
    evidence = build["reconciled"]["evidence"]
    assert evidence["precondition_before"] != evidence["precondition_now"]
    assert fleet.effect_lines() == []  # not retried, nothing ran again
    assert fleet.started.read_text().split() == ["1"]


def test_an_effect_not_tied_to_the_operation_waits_in_manual_review_until_resolved(fleet: Fleet):
    secret = fleet.register(
        f'echo "release 41 uploaded by hand" >> {fleet.effect}; echo "$RELEVO_ATTEMPT" >> {fleet.started}; '
        "sleep 60",
        probe=f'grep -F "$RELEVO_OPERATION_ID" {fleet.effect} && exit 0; [ -s {fleet.effect} ] || exit 1; '
        f"cat {fleet.effect}",
    )
    with fleet.agent("mac-a") as mac_a:
        job_id = fleet.push(secret)
        fleet.wait_started()
        mac_a.kill()
        mac_a.wait()
    with fleet.agent("mac-b"):
        job = fleet.wait_job(job_id, until=lambda job: job["stages"][0]["status"] == "manual_review")
        assert job["status"] == "running"
        assert (
            job["stages"][0]["reconciled"]["evidence"]["probe_output"].strip()
            == "release 41 uploaded by hand"
        )
        resolved = subprocess.run(
            [
                sys.executable,
                "-m",
                "relevo_cli.main",
                "job",
                "resolve",
                job_id,
                "--stage",
                "build",
                "--as",
                "succeeded",
                "--reason",
                "release 41 is this job's",
                "--stack-file",
                str(fleet.stack_file),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert resolved.returncode == 0, resolved.stderr
        job = fleet.wait_job(job_id)

    assert job["status"] == "succeeded"
    # Nothing was overwritten: the build's effect is the one found, the upload ran once.
    assert fleet.effect_lines() == ["release 41 uploaded by hand", f"{job_id}:upload"]
    assert job["stages"][0]["resolution"]["as"] == "succeeded"


def test_a_canceled_job_has_its_process_group_killed_within_seconds_whatever_the_lease(fleet: Fleet):
    """Issue 14: with a 60 s lease the command used to run on for 34 s after the cancel, and the
    canceled job's stage showed `running` for good."""
    pid_file = fleet.tmp / "pid"
    # The command ignores SIGTERM: only the SIGKILL after the grace ends it.
    secret = fleet.register(
        f'echo $$ > {pid_file}; echo 1 >> {fleet.started}; trap "" TERM; while true; do sleep 0.2; done',
        lease_ttl_sec=60,
    )
    with fleet.agent("mac-a"):
        job_id = fleet.push(secret)
        fleet.wait_started()
        pid = int(pid_file.read_text())
        fleet.api.cancel_job(job_id)
        canceled = time.monotonic()
        # The cancel ends the stage; the agent's next renewal (every min(lease/3, 3 s)) is
        # refused; SIGTERM, then SIGKILL after kill_grace_sec (1 s).
        wait_until(lambda: gone(pid), 30, "the stage's process group killed")
        elapsed = time.monotonic() - canceled
        job = fleet.wait_job(job_id)
    # Noticed at a renewal (every 3 s), not when the 60 s lease ran out: the lease is the bound,
    # with room for a loaded machine.
    assert elapsed < 60 / 2
    assert "canceled (its job ended, or a sibling shard failed); stopping the stage" in fleet.log("mac-a")
    assert (job["status"], [stage["status"] for stage in job["stages"]]) == (
        "canceled",
        ["canceled", "skipped"],
    )


def test_first_sigterm_lets_the_running_stage_finish(fleet: Fleet):
    secret = fleet.register(
        f'echo "$RELEVO_ATTEMPT" >> {fleet.started}; sleep 2; echo "$RELEVO_OPERATION_ID" >> {fleet.effect}',
        # Nothing here waits for a lease to lapse: with the module's 3 s lease a loaded host's
        # claim took most of it and the stage was fenced before the drain could let it finish.
        lease_ttl_sec=30,
    )
    with fleet.agent("mac-a") as mac_a:
        job_id = fleet.push(secret)
        fleet.wait_started()
        mac_a.send_signal(signal.SIGTERM)
        assert mac_a.wait(timeout=60) == 0
    build = fleet.api.get_job(job_id)["stages"][0]
    assert (build["status"], build["attempt"]) == ("succeeded", 1)
    assert fleet.effect_lines() == [f"{job_id}:build"]  # the drain took no further stage


def test_second_sigterm_cancels_the_stage_as_agent_shutdown_and_it_is_retried(fleet: Fleet):
    pid_file = fleet.tmp / "pid"
    secret = fleet.register(
        # Long on the first attempt only, which the second signal cuts short.
        f'echo $$ > {pid_file}; echo "$RELEVO_ATTEMPT" >> {fleet.started}; [ "$RELEVO_ATTEMPT" = 1 ] && '
        "sleep 60; "
        f'echo "$RELEVO_OPERATION_ID" >> {fleet.effect}',
        probe=fleet.probe,
        lease_ttl_sec=30,  # the retry below comes from the shutdown report, not a lease expiry
    )
    with fleet.agent("mac-a") as mac_a:
        job_id = fleet.push(secret)
        fleet.wait_started()
        pid = int(pid_file.read_text())
        mac_a.send_signal(signal.SIGTERM)
        time.sleep(0.5)  # two separate signals, as an operator would send them
        mac_a.send_signal(signal.SIGTERM)
        assert mac_a.wait(timeout=30) == 0
    assert gone(pid)
    with fleet.agent("mac-b"):
        job = fleet.wait_job(job_id, timeout=60)

    assert job["status"] == "succeeded", fleet.log("mac-b")[-3000:]
    build = job["stages"][0]
    assert [entry["error"] for entry in build["attempts_log"]] == ["Relevo.Transient.AgentShutdown"]
    assert (build["agent_id"], build["attempt"], build["reconciled"]["decision"]) == (
        fleet.agent_id("mac-b"),
        2,
        "rerun",
    )
    assert fleet.effect_lines() == [f"{job_id}:build", f"{job_id}:upload"]


def test_third_signal_exits_at_once_and_the_watchdog_kills_the_stage(fleet: Fleet):
    pid_file = fleet.tmp / "pid"
    secret = fleet.register(
        f'echo $$ > {pid_file}; echo 1 >> {fleet.started}; trap "" TERM; while true; do sleep 0.2; done'
    )
    with fleet.agent("mac-a") as mac_a:
        fleet.push(secret)
        fleet.wait_started()
        pid = int(pid_file.read_text())
        for _ in range(3):
            mac_a.send_signal(signal.SIGINT)
            time.sleep(0.05)
        assert mac_a.wait(timeout=10) == 130
        wait_until(lambda: gone(pid), 5, "the stage's process group killed by its watchdog")


def _mac_a_killed_mid_build(fleet: Fleet, **project: Any) -> str:
    """mac-a starts a two-second build and is SIGKILLed before it ends; returns the job id."""
    secret = fleet.register(
        f'echo "$RELEVO_ATTEMPT" >> {fleet.started}; sleep 2; echo "$RELEVO_OPERATION_ID" >> {fleet.effect}',
        probe=fleet.probe,
        **project,
    )
    with fleet.agent("mac-a") as mac_a:
        job_id = fleet.push(secret)
        fleet.wait_started()
        mac_a.kill()
        mac_a.wait()
    return job_id


def test_a_restarted_agent_fails_its_interrupted_attempts_and_they_are_reconciled(fleet: Fleet):
    # A lease far longer than the test: the retry comes from the restart's report.
    job_id = _mac_a_killed_mid_build(fleet, lease_ttl_sec=60)
    journal = fleet.journal("mac-a")
    in_flight = sqlite3.connect(journal).execute(
        "SELECT operation_id, pgid FROM operations WHERE outcome = 'running'"
    )
    [(operation, pgid)] = in_flight.fetchall()  # the journal knew what was in flight, and its process group
    assert operation == f"{job_id}:build" and pgid
    restarted = time.monotonic()
    with fleet.agent("mac-a"):
        job = fleet.wait_job(job_id, timeout=45)
    assert time.monotonic() - restarted < 45 < 60  # well inside the lease
    assert job["status"] == "succeeded", fleet.log("mac-a")[-3000:]
    build = job["stages"][0]
    assert [entry["error"] for entry in build["attempts_log"]] == ["Relevo.Transient.AgentShutdown"]
    assert (build["attempt"], build["reconciled"]["decision"]) == (2, "rerun")
    assert fleet.effect_lines() == [f"{job_id}:build", f"{job_id}:upload"]
    assert "was in flight; reporting it interrupted" in fleet.log("mac-a")


def test_a_restarted_agent_whose_journal_was_lost_leaves_the_attempt_to_its_lease(fleet: Fleet):
    """Issue 14: a restarted agent takes over only its own journal's attempts. With the journal
    gone it cannot tell its own from another Mac's with the same agent_id (nor could it get their
    job credentials: the claim's secret was in the journal): the lease decides."""
    # A 10 s lease: attempt 1's lapses long before the killed agent's presence goes stale (up to
    # 30 s, below), so the test waits no longer; attempt 2 then runs under a lease a loaded host's
    # late renewal does not lapse (with the module's 3 s one, a fresh-clone run on a loaded 2-core
    # host fenced attempt 2 too, and the attempts log read two lease expiries).
    job_id = _mac_a_killed_mid_build(fleet, lease_ttl_sec=10)
    journal = fleet.journal("mac-a")
    for path in journal.parent.glob(journal.name + "*"):
        path.unlink()
    # Without its journal it cannot tell its killed self from a clone: it refuses to start (exit 2,
    # launchd starts it again) until the killed one's presence has gone stale.
    with fleet.agent("mac-a") as refused:
        assert refused.wait(timeout=30) == 2
    assert "is in use by another relevo-agent" in fleet.log("mac-a")
    wait_until(lambda: not _online(fleet, "mac-a"), 30, "the killed agent's presence stale")
    with fleet.agent("mac-a"):
        job = fleet.wait_job(job_id, timeout=60)
    assert job["status"] == "succeeded", fleet.log("mac-a")[-3000:]
    build = job["stages"][0]
    assert [entry["error"] for entry in build["attempts_log"]] == ["Relevo.Lease.Expired"]
    assert (build["attempt"], build["reconciled"]["decision"]) == (2, "rerun")
    assert fleet.effect_lines() == [f"{job_id}:build", f"{job_id}:upload"]
    # A restarted agent knows its attempts from its journal only (the claim route gives their
    # credentials again for the claim's secret, which only that journal held): nothing was reported
    # for the killed one's attempt, which its lease decided.
    assert "was in flight; reporting it interrupted" not in fleet.log("mac-a")


def _online(fleet: Fleet, name: str) -> bool:
    now = datetime.now(UTC)
    return any(
        a.agent_id == fleet.agent_id(name) and a.is_online(now)
        for a in agents.agents_in_region(fleet.stack.table_name, "eu-west")
    )


def test_a_second_agent_with_the_same_agent_id_refuses_to_start_and_leaves_the_first_ones_stage_alone(
    fleet: Fleet,
):
    """Issue 14: a cloned Mac image started a second agent with an agent_id in use; it failed the
    first one's live stage at startup and the two overwrote each other's presence."""
    secret = fleet.register(
        f'echo "$RELEVO_ATTEMPT" >> {fleet.started}; sleep 4; echo "$RELEVO_OPERATION_ID" >> {fleet.effect}',
        probe=fleet.probe,
        lease_ttl_sec=30,
    )
    with fleet.agent("mac-a"):
        job_id = fleet.push(secret)
        fleet.wait_started()
        clone = subprocess.run(
            [
                sys.executable,
                "-m",
                "relevo_agent.launch",
                "--config",
                str(fleet.config("mac-a", mac="mac-a-clone")),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        job = fleet.wait_job(job_id)

    assert clone.returncode == 2, clone.stderr[-2000:]
    assert f"agent_id {fleet.agent_id('mac-a')} is in use by another relevo-agent on host" in clone.stderr
    assert job["status"] == "succeeded", fleet.log("mac-a")[-3000:]
    build = job["stages"][0]
    assert (build["attempt"], build["attempts_log"]) == (1, [])  # nobody failed the live stage
    assert fleet.effect_lines() == [f"{job_id}:build", f"{job_id}:upload"]


# ---------------------------------------------------------------------------- cut off
@pytest.mark.parametrize("effect_before_cut", [True, False], ids=["probe-decides", "journal-receipt-decides"])
def test_an_agent_cut_off_longer_than_its_lease_fences_itself_and_the_outcome_is_reconciled(
    fleet: Fleet, effect_before_cut: bool
):
    endpoint = str(fleet.stack.aws_endpoint).split("//", 1)[1].rstrip("/")
    host, port = endpoint.split(":")
    # Every connection is reset while cut: each call fails at once (the black hole of a
    # partition is relevo-tools drill's and tests/e2e/test_fencing.py's).
    proxy = FaultProxy((host, int(port))).start()
    # The stack's API too (the claim routes, which carry the heartbeats and the report): a cut
    # Mac reaches neither.
    api = urlsplit(str(fleet.stack.api_url))
    api_proxy = FaultProxy((api.hostname, api.port)).start()
    proxied = fleet.tmp / "stack-proxied.json"
    proxied.write_text(
        fleet.stack.model_copy(
            update={
                "aws_endpoint": proxy.url,
                "api_url": f"{api_proxy.url.rstrip('/')}{api.path}",
            }
        ).model_dump_json()
    )
    if effect_before_cut:
        # The effect lands at once; the command is still running when the network goes.
        build = (
            f'echo "$RELEVO_OPERATION_ID" >> {fleet.effect}; echo "$RELEVO_ATTEMPT" >> '
            f"{fleet.started}; sleep 60"
        )
    else:
        # The command ends (and its receipt is journaled) while the network is gone.
        build = (
            f'echo "$RELEVO_ATTEMPT" >> {fleet.started}; sleep 1; echo "$RELEVO_OPERATION_ID" >> '
            f"{fleet.effect}"
        )
    secret = fleet.register(build, probe=fleet.probe)
    try:
        with fleet.agent("mac-a", stack_file=proxied):
            job_id = fleet.push(secret)
            fleet.wait_started()
            proxy.set_mode(Mode.RESET, reset_probability=1.0)
            api_proxy.set_mode(Mode.RESET, reset_probability=1.0)
            # Longer than the lease: the state machine gives the attempt up, the agent fences.
            wait_until(
                lambda: any(
                    e["error"] == "Relevo.Lease.Expired"
                    for e in fleet.api.get_job(job_id)["stages"][0]["attempts_log"]
                ),
                60,
                "the lease expiry seen by the state machine",
            )
            if effect_before_cut:
                wait_until(
                    lambda: "fenced: killed at the lease deadline" in fleet.log("mac-a"),
                    30,
                    "the agent fencing itself",
                )
            else:
                wait_until(
                    lambda: "deferred to the outbox" in fleet.log("mac-a"),
                    30,
                    "the report kept in the outbox",
                )
            proxy.heal()
            api_proxy.heal()
            job = fleet.wait_job(job_id)
    finally:
        proxy.close()
        api_proxy.close()

    assert job["status"] == "succeeded", fleet.log("mac-a")[-4000:]
    build_stage = job["stages"][0]
    assert build_stage["attempt"] == 2
    # Whichever decided, the build ran once: one line per completed stage.
    assert fleet.effect_lines() == [f"{job_id}:build", f"{job_id}:upload"]
    assert fleet.started.read_text().split() == ["1"]
    expected = "succeeded" if effect_before_cut else "resend_receipt"
    assert build_stage["reconciled"]["decision"] == expected, build_stage["reconciled"]
