"""The drill's world: a stack, two relevo-agent processes of one region, each behind its own
loopback fault proxy, and projects whose stages append their effect, named by the operation id,
to one file. What the drills observe (the stage's process group, its effects, the job's view)
is read from here. The release drills add the local Apple service (`ensure_apple`), each agent
reaching it through a fault proxy of its own.

Everything an agent gets from its environment (the endpoint it talks to, its credentials) comes
from `agent_environment`: that is the one place to point when the local stack hands agents IAM
credentials of their own.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from relevo_agent.supervisor import group_alive
from relevo_cli.api import ApiError, RelevoApi
from relevo_core.aws import client
from relevo_core.files.stack import StackInfo
from relevo_core.store import agents as presence
from relevo_core.store.codec import from_attributes
from relevo_local.apple.connect_state import Timing
from relevo_local.apple.provision import LocalApple, start_local_apple
from relevo_local.processes import agent_process, random_commit
from relevo_tools.drill.proxy import LOOPBACK, FaultProxies, FaultProxy

REGION = "eu-west"
AGENT_IDS = ("drill-a", "drill-b")
TERMINAL_JOB = ("succeeded", "failed", "canceled")
TERMINAL_STAGE = ("succeeded", "failed", "skipped", "canceled")
# The release drill's Apple, on the real clock: processing in seconds, and a review that ends as
# soon as the file is in (a trial that needs a submission in progress holds it: faults.hold_in_progress).
RELEASE_TIMING = Timing(upload_processing_sec=3.0, build_processing_sec=5.0)
RELEASE_REVIEW_SEC = 0.0


class DrillError(Exception):
    """The drill could not observe what it needed (not a verdict on Relevo)."""


@dataclass(frozen=True)
class DrillTiming:
    """The numbers every drill is built from. The defaults are the issue's: a 6 s lease and a stage
    whose effect lands 10 s in, so a command that outlived its lease would land its effect after
    the next attempt started."""

    lease_ttl_sec: int = 6
    effect_after_sec: float = 10.0
    kill_grace_sec: int = 1
    # Both agents share this host's clock: a small allowed skew keeps the fence margin small.
    max_clock_skew_sec: float = 1.0
    queue_timeout_sec: int = 120
    # Whatever happens, a trial gives up waiting for its job after this long.
    trial_timeout_sec: float = 150.0

    @classmethod
    def fast(cls) -> DrillTiming:
        """`make test`: one quick trial of each drill."""
        return cls(lease_ttl_sec=5, effect_after_sec=8.0, max_clock_skew_sec=0.5)


def agent_environment(
    stack: StackInfo, endpoint: str, work: Path, agent_id: str, api_url: str | None = None
) -> tuple[Path, dict[str, str]]:
    """The stack file an agent reads (the stack's own, its AWS endpoint replaced by `endpoint`
    and its API by `api_url`, the agent's fault proxies) and the variables its process gets on top
    of the drill's own. The agent itself runs as its region's agent role (the stack file's
    agent_credentials) and each stage with the job's credentials its claim returns."""
    stack_file = work / f"{agent_id}-stack.json"
    update: dict[str, str] = {"aws_endpoint": endpoint}
    if api_url:
        update["api_url"] = api_url
    stack_file.write_text(stack.model_copy(update=update).model_dump_json())
    env = {
        "AWS_ACCESS_KEY_ID": os.environ.get("AWS_ACCESS_KEY_ID", "testing"),
        "AWS_SECRET_ACCESS_KEY": os.environ.get("AWS_SECRET_ACCESS_KEY", "testing"),
        # The handoff drill's stages compute their tree's digest with it (relevo_tools.drill.drills).
        "RELEVO_DRILL_PYTHON": sys.executable,
    }
    if os.environ.get("AWS_SESSION_TOKEN"):
        env["AWS_SESSION_TOKEN"] = os.environ["AWS_SESSION_TOKEN"]
    return stack_file, env


@dataclass
class DrillAgent:
    agent_id: str
    proxy: FaultProxies
    config: Path
    log: Path
    env: dict[str, str]
    process: subprocess.Popen[bytes] | None = None
    apple_proxy: FaultProxy | None = None  # its path to the local Apple service (the release drill)
    _exits: ExitStack = field(default_factory=ExitStack)

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self) -> None:
        self._exits = ExitStack()
        self.process = self._exits.enter_context(agent_process(self.config, self.log, env=self.env))

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            try:
                os.kill(self.process.pid, signal.SIGCONT)  # a frozen agent cannot drain
            except ProcessLookupError:
                pass
        self._exits.close()
        self.process = None

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


@dataclass(frozen=True)
class StageStart:
    """One start of the faulted stage's command (its marker line)."""

    operation_id: str
    attempt: int
    pgid: int  # the bash leader's pid: it leads its own session, hence its process group
    at: float  # wall clock, whole seconds (the command's own `date +%s`)
    seen: float = 0.0  # monotonic: when the drill saw the start


class DrillFleet:
    """Two agents of one region, each behind its own fault proxy, and the drill's projects."""

    def __init__(
        self, stack: StackInfo, work: Path, timing: DrillTiming, say: Callable[[str], None] = lambda _: None
    ) -> None:
        self.stack = stack
        self.work = work
        self.timing = timing
        self.say = say
        self.api = RelevoApi.for_stack(stack)
        self.effects = work / "effects.log"
        self.starts = work / "starts.log"
        self.effects.touch()
        self.starts.touch()
        self.agents: dict[str, DrillAgent] = {}
        self.apple: LocalApple | None = None  # started by the first drill that needs it
        self._projects: dict[str, str] = {}
        self.last_jobs: list[str] = []  # the jobs of the trial running now (the runner clears it)

    # ------------------------------------------------------------------ agents
    def start(self) -> DrillFleet:
        for agent_id in AGENT_IDS:
            self._add_agent(agent_id)
        self.wait_online()
        return self

    def _add_agent(self, agent_id: str) -> None:
        target = urlsplit(str(self.stack.aws_endpoint))
        api = urlsplit(self.stack.api_url)
        to_aws = FaultProxy((target.hostname or "127.0.0.1", target.port or 80)).start()
        to_api = FaultProxy((api.hostname or "127.0.0.1", api.port or 80)).start()
        stack_file, env = agent_environment(
            self.stack, to_aws.url, self.work, agent_id, api_url=f"{to_api.url}{api.path}"
        )
        agent = DrillAgent(
            agent_id,
            FaultProxies([to_aws, to_api]),
            self.work / f"{agent_id}.toml",
            self.work / f"{agent_id}.log",
            env,
        )
        if self.apple is not None:
            self._attach_apple(agent)
        self._agent_config(agent, stack_file)
        agent.start()
        self.agents[agent_id] = agent

    def ensure_apple(self) -> LocalApple:
        """The local Apple service, started at the first need; every agent restarted with its
        `[release_endpoints]` pointing there through a fault proxy of its own."""
        if self.apple is not None:
            return self.apple
        self.apple = start_local_apple(timing=RELEASE_TIMING, review_sec=RELEASE_REVIEW_SEC)
        for agent in self.agents.values():
            agent.stop()
            self._attach_apple(agent)
            self._agent_config(agent, self.work / f"{agent.agent_id}-stack.json")
            agent.start()
        self.wait_online()
        return self.apple

    def _attach_apple(self, agent: DrillAgent) -> None:
        assert self.apple is not None
        agent.apple_proxy = FaultProxy((LOOPBACK, self.apple.service.port)).start()
        agent.proxy.proxies.append(agent.apple_proxy)

    def ensure_agents(self, count: int) -> None:
        """At least `count` agents, each behind its own proxies, all online: a drill that needs
        more Macs than two (the parallel drill's shards) adds them; they stay for the drills after."""
        for number in range(len(self.agents), count):
            self._add_agent(f"drill-{chr(ord('a') + number)}")
        self.wait_online()

    def _agent_config(self, agent: DrillAgent, stack_file: Path) -> None:
        agent_id = agent.agent_id
        settings: dict[str, Any] = {
            "agent_id": agent_id,
            "region": REGION,
            "capacity": 1,
            "workspace_root": str(self.work / f"{agent_id}-workspaces"),
            "journal": str(self.work / f"{agent_id}-journal.sqlite3"),
            "stack_file": str(stack_file),
            "poll_wait_sec": 1,
            "presence_interval_sec": 2,
            "handoff_delay_sec": 1,
            "outbox_interval_sec": 0.5,
            "max_clock_skew_sec": self.timing.max_clock_skew_sec,
        }
        text = "".join(f"{name} = {json.dumps(value)}\n" for name, value in settings.items())
        if self.apple is not None and agent.apple_proxy is not None:
            text += self.apple.agent_config(via=agent.apple_proxy.url)
        agent.config.write_text(text)

    def wait_online(self, timeout: float = 60) -> None:
        def online() -> bool:
            now = datetime.now(UTC)
            seen = {a.agent_id for a in presence.online_agents(self.stack.table_name, REGION, now)}
            return all(agent_id in seen for agent_id, agent in self.agents.items() if agent.alive())

        wait_until(online, timeout, "the drill's agents online")

    def heal_all(self) -> None:
        """Every proxy passes, every agent runs (restarted if a drill killed it), all online."""
        for agent in self.agents.values():
            agent.proxy.heal()
            if not agent.alive():
                agent.stop()
                agent.start()
        self.wait_online()

    def close(self) -> None:
        for agent in self.agents.values():
            agent.stop()
            agent.proxy.close()
        if self.apple is not None:
            self.apple.stop()

    # ------------------------------------------------------------------ projects and jobs
    def project(
        self,
        kind: str,
        deliver: str | None = None,
        announce: str | None = None,
        handoff: list[str] | None = None,
        fan_out: dict[str, Any] | None = None,
        **settings: Any,
    ) -> str:
        """A project of two stages, `deliver` and `announce`. Both append their effect, named by
        the operation id, to one file and probe for it. By default deliver marks its start and
        lands its effect effect_after_sec in; a drill may give either command, and run deliver as
        shards (`fan_out`: parallel, fail_fast...). Registered once per kind."""
        if kind in self._projects:
            return self._projects[kind]
        project_id = f"drill-{kind}-{secrets.token_hex(3)}"
        probe = f'grep -F "$RELEVO_OPERATION_ID attempt=" {self.effects}'
        deliver = (
            deliver or f"{self.start_marker()}; sleep {self.timing.effect_after_sec}; {self.effect_command()}"
        )
        grace = self.timing.kill_grace_sec
        body = {
            "repo": f"drill/{project_id}",
            "region_affinity": REGION,
            "lease_ttl_sec": self.timing.lease_ttl_sec,
            "queue_timeout_sec": self.timing.queue_timeout_sec,
            "retry": {"backoff_base_sec": 0},
            "stages": [
                {
                    "name": "deliver",
                    "run": deliver,
                    "effect_probe": probe,
                    "kill_grace_sec": grace,
                    "exec_timeout_sec": 120,
                    **({"handoff": handoff} if handoff else {}),
                    **(fan_out or {}),
                },
                {
                    "name": "announce",
                    "run": announce or self.effect_command(),
                    "effect_probe": probe,
                    "kill_grace_sec": grace,
                    "exec_timeout_sec": 60,
                },
            ],
            **settings,
        }
        self.api.put_project(project_id, body)
        self._projects[kind] = project_id
        return project_id

    def project_of(self, kind: str, body: Callable[[str], dict[str, Any]]) -> str:
        """A project of the drill's own making (`body` given its id), registered once per kind,
        with the fleet's region, lease and queue timeout."""
        if kind not in self._projects:
            project_id = f"drill-{kind}-{secrets.token_hex(3)}"
            settings = {
                "repo": f"drill/{project_id}",
                "region_affinity": REGION,
                "lease_ttl_sec": self.timing.lease_ttl_sec,
                "queue_timeout_sec": self.timing.queue_timeout_sec,
            }
            self.api.put_project(project_id, {**settings, **body(project_id)})
            self._projects[kind] = project_id
        return self._projects[kind]

    def effect_command(self) -> str:
        return f'echo "$RELEVO_OPERATION_ID attempt=$RELEVO_ATTEMPT" >> {self.effects}'

    def start_marker(self) -> str:
        """One line per start of the command: operation, attempt, its process group, the time."""
        return f'echo "$RELEVO_OPERATION_ID $RELEVO_ATTEMPT $$ $(date +%s)" >> {self.starts}'

    def run(self, project_id: str) -> str:
        answer = self.api.run_project(project_id, {"trigger": "api", "commit": random_commit()})
        self.last_jobs.append(str(answer["job_id"]))
        return str(answer["job_id"])

    def job(self, job_id: str) -> dict[str, Any]:
        return self.api.get_job(job_id)

    def wait_job(
        self, job_id: str, until: Callable[[dict[str, Any]], bool] | None = None, timeout: float | None = None
    ) -> dict[str, Any]:
        done = until or (lambda job: job["status"] in TERMINAL_JOB)
        seen: dict[str, Any] = {}

        def check() -> bool:
            try:
                seen["job"] = self.job(job_id)
            except (ApiError, OSError):
                return False
            return done(seen["job"])

        wait_until(check, timeout or self.timing.trial_timeout_sec, f"job {job_id}")
        return seen["job"]

    # ------------------------------------------------------------------ observation
    def stage_starts(self, job_id: str) -> list[StageStart]:
        starts = []
        for line in self.starts.read_text().splitlines():
            parts = line.split()
            if len(parts) == 4 and parts[0] == f"{job_id}:deliver":
                starts.append(StageStart(parts[0], int(parts[1]), int(parts[2]), float(parts[3])))
        return starts

    def wait_stage_start(self, job_id: str, attempt: int | None = 1, timeout: float = 60) -> StageStart:
        """The deliver stage's start of this attempt (None: of whichever attempt starts first)."""
        found: list[StageStart] = []

        def started() -> bool:
            found[:] = [s for s in self.stage_starts(job_id) if attempt is None or s.attempt == attempt]
            return bool(found)

        wait_until(started, timeout, f"{job_id}:deliver attempt {attempt or 'any'} started", poll=0.05)
        return dataclasses.replace(found[0], seen=time.monotonic())

    def stage_record(self, job_id: str, index: int) -> dict[str, Any]:
        """The stage's record as its holder left it (read from the table: not the API's view)."""
        item = (
            client("dynamodb")
            .get_item(
                TableName=self.stack.table_name,
                Key={"pk": {"S": f"STAGES#{job_id}"}, "sk": {"S": f"STAGE#{index:02d}"}},
                ConsistentRead=True,
            )
            .get("Item", {})
        )
        return from_attributes(item)

    def holder(self, job_id: str, attempt: int) -> DrillAgent:
        """The agent that claimed `attempt` of the deliver stage, read from its stage record (not
        the API: a loaded machine's functions answer in seconds, and the fault must not wait)."""
        found: dict[str, Any] = {}

        def claimed() -> bool:
            item = (
                client("dynamodb")
                .get_item(
                    TableName=self.stack.table_name,
                    Key={"pk": {"S": f"STAGES#{job_id}"}, "sk": {"S": "STAGE#00"}},
                    ConsistentRead=True,
                )
                .get("Item", {})
            )
            found.update(from_attributes(item))
            return found.get("attempt") == attempt and found.get("agent_id") in self.agents

        wait_until(claimed, 30, f"{job_id}:deliver attempt {attempt} claimed", poll=0.05)
        return self.agents[found["agent_id"]]

    def effect_counts(self, job_id: str) -> dict[str, int]:
        counts: dict[str, int] = {}
        for line in self.effects.read_text().splitlines():
            operation = line.split(" ", 1)[0]
            if operation.startswith(f"{job_id}:"):
                counts[operation] = counts.get(operation, 0) + 1
        return counts


class GroupWatch:
    """When a process group was last seen alive (polled on a thread of its own)."""

    def __init__(self, pgid: int, timeout: float = 300) -> None:
        self.pgid = pgid
        self.gone_at: float | None = None  # monotonic
        self._deadline = time.monotonic() + timeout
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while time.monotonic() < self._deadline:
            if not group_alive(self.pgid, zombies_are_dead=True):
                self.gone_at = time.monotonic()
                return
            time.sleep(0.05)

    def wait(self, timeout: float) -> float | None:
        self._thread.join(timeout)
        return self.gone_at


def wait_until(check: Callable[[], bool], timeout: float, what: str, poll: float = 0.2) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise DrillError(f"{what}: not seen within {timeout:.0f}s")
        time.sleep(poll)
