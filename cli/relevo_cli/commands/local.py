"""`relevo local …`: the embedded local stack — start it (`up`), see it (`status`), stop it
(`down`), and run an agent against it (`agent`).

The emulator is a package of its own (relevo_local, moto and its patches): each command imports it
when it runs, so the rest of the CLI starts without it."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from importlib.util import find_spec
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from relevo_cli.api import ApiError, RelevoApi
from relevo_cli.cli_errors import UserMistake
from relevo_cli.commands.common import console, print_json
from relevo_core.files.stack import DEFAULT_STATE_DIR, StackInfo, load_stack

if TYPE_CHECKING:
    from relevo_local.state_dir import Holder

local_app = typer.Typer(no_args_is_help=True, help="The embedded local stack.")

StateDirOption = typer.Option(
    DEFAULT_STATE_DIR, "--state-dir", help="the stack's state dir (where stack.json is)"
)

# moto 5.2.5 keeps every service's state in the server's memory. Its only persistence feature is
# the recorder (moto-api/recorder), which records requests and replays them: a replay would start
# every execution again and re-send every message, with new task tokens, rather than restore the
# state, and what the local stack does inside the emulator's process is not a request at all.
IN_MEMORY = (
    "State is in memory: stopping this stack loses its projects, jobs and logs "
    "(the emulator, moto 5.2.5, can only record and replay requests, which would run executions again "
    "rather than restore them, so no persistence is offered)."
)


def _require_emulator() -> None:
    if find_spec("relevo_local") is None:
        raise UserMistake(
            "relevo local runs the emulator, relevo-local, which is not installed beside this CLI (pip "
            "install ./local)"
        )


def _say(line: str) -> None:
    console.print(line, markup=False, highlight=False, soft_wrap=True)


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{hours}h {minutes:02d}m" if hours else f"{minutes}m {seconds:02d}s"


@local_app.command("up")
def local_up(
    state_dir: Path = typer.Option(DEFAULT_STATE_DIR, "--state-dir", help="where stack.json is written"),
    region_affinities: str | None = typer.Option(None, help="comma-separated region affinities"),
    queue_limit: int | None = typer.Option(None, help="QueueLimit parameter"),
    api_port: int = typer.Option(0, help="port of the local API (0: any free port)"),
) -> None:
    """Start the embedded AWS stack in the foreground until SIGINT or SIGTERM (`relevo local down`)."""
    _require_emulator()
    from relevo_local.identity import ACCOUNT_ID, LOCAL_USER
    from relevo_local.moto import UnverifiedMoto, check_moto_version
    from relevo_local.stack import LocalStack
    from relevo_local.state_dir import AlreadyRunning, StateDirLock

    try:
        check_moto_version()  # before the state dir is taken: one line, nothing started
    except UnverifiedMoto as exc:
        raise UserMistake(str(exc)) from exc

    lock = StateDirLock(state_dir)
    try:
        lock.acquire()
    except AlreadyRunning as exc:
        raise UserMistake(str(exc)) from exc
    # Ours now: a stack.json left by a stack that crashed names nothing that runs.
    (state_dir / "stack.json").unlink(missing_ok=True)
    # The stack's own IAM user, the one a person at this machine signs as, is its administrator:
    # a job that does not exist is 404 to them, not the 403 that hides existence from others.
    parameters = {"AdminPrincipals": f"arn:aws:iam::{ACCOUNT_ID}:user/{LOCAL_USER}"}
    if region_affinities:
        parameters["RegionAffinities"] = region_affinities
    if queue_limit is not None:
        parameters["QueueLimit"] = str(queue_limit)
    stack = LocalStack(state_dir=state_dir, parameters=parameters, api_port=api_port)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    try:
        info = stack.start()
        lock.publish(info.api_url, info.aws_endpoint)
        print(
            f"Relevo local stack ready: API {info.api_url} (AWS endpoint {info.aws_endpoint}, "
            f"{state_dir / 'stack.json'})",
            flush=True,
        )
        print(IN_MEMORY, flush=True)
        first = sorted(info.work_queues)[0] if info.work_queues else "REGION"
        print(
            f"Next: relevo local agent --region {first} · relevo local status · relevo local down (or "
            "Ctrl-C)",
            flush=True,
        )
        stop.wait()
    finally:
        stack.stop()
        (state_dir / "stack.json").unlink(missing_ok=True)
        # The state dir's lock is not given back here: the kernel drops it when this process
        # exits, which takes seconds more (the interpreter's teardown of the emulator's state).
        # `relevo local down` waits for the lock, so it says "stopped" once the process is gone,
        # and no new stack starts on this dir while this one still holds its ports.
        lock.hold_until_exit()


def _running_stack(state_dir: Path) -> tuple[Holder, StackInfo | None]:
    _require_emulator()
    from relevo_local.state_dir import running

    holder = running(state_dir)
    if holder is None:
        raise typer.Exit(_say_not_running(state_dir))
    stack_file = state_dir / "stack.json"
    return holder, load_stack(stack_file) if stack_file.is_file() and holder.api_url else None


def _say_not_running(state_dir: Path) -> int:
    _say(
        f"no local stack is running on {state_dir} (start one with `relevo local up --state-dir {state_dir}`)"
    )
    return 1


def _fleet(stack: StackInfo) -> tuple[list[dict[str, Any]] | str, list[dict[str, Any]] | str]:
    """The stack's projects and agents, or why they cannot be listed."""
    stack.apply_to_environment()
    api = RelevoApi.for_stack(stack)
    try:
        projects: list[dict[str, Any]] | str = api.list_projects()["projects"]
    except ApiError as exc:
        projects = f"cannot list them: {exc}"
    try:
        agents: list[dict[str, Any]] | str = api.queue()["agents"]
    except ApiError as exc:
        agents = f"cannot list them: {exc}"
    return projects, agents


@local_app.command("status")
def local_status(
    state_dir: Path = StateDirOption,
    as_json: bool = typer.Option(False, "--json", help="print it as JSON"),
) -> None:
    """Whether a local stack runs on the state dir: pid, uptime, URLs, regions, projects, agents (exit 1: none
    runs)."""
    holder, stack = _running_stack(state_dir)
    projects, agents = _fleet(stack) if stack else ([], [])
    if as_json:
        print_json(
            {
                "state_dir": str(state_dir),
                "pid": holder.pid,
                "started_at": holder.started_at,
                "uptime_sec": int(holder.uptime_sec),
                "ready": stack is not None,
                "api_url": holder.api_url,
                "aws_endpoint": holder.aws_endpoint,
                "work_queues": stack.work_queues if stack else {},
                "projects": projects,
                "agents": agents,
            }
        )
        return
    lines = [
        f"local stack up on {state_dir}: pid {holder.pid}, up {_duration(holder.uptime_sec)}"
        + ("" if stack else " (starting)")
    ]
    if stack:
        lines += [
            f"API {stack.api_url} · AWS endpoint {stack.aws_endpoint} · {state_dir / 'stack.json'}",
            f"regions: {', '.join(sorted(stack.work_queues)) or 'none'}",
        ]
        if isinstance(projects, str):
            lines.append(f"projects: {projects}")
        else:
            lines.append(
                f"projects ({len(projects)}): "
                + (
                    ", ".join(f"{p['id']} ({p['region_affinity']})" for p in projects)
                    or "none yet (relevo project apply FILE)"
                )
            )
        if isinstance(agents, str):
            lines.append(f"agents: {agents}")
        else:
            online = [a for a in agents if a["online"]]
            lines.append(
                f"agents ({len(online)} online of {len(agents)}): "
                + (
                    ", ".join(
                        f"{a['agent_id']} ({a['region']}, "
                        f"{a['used']}/{a['capacity']}{'' if a['online'] else ', offline'})"
                        for a in agents
                    )
                    or "none yet (relevo local agent --region R)"
                )
            )
        lines.append(IN_MEMORY)
    for line in lines:
        _say(line)


@local_app.command("down")
def local_down(
    state_dir: Path = StateDirOption,
    timeout_sec: float = typer.Option(60, "--timeout", min=1, help="seconds to wait for it to stop"),
) -> None:
    """Stop the local stack running on the state dir, and wait until it has stopped."""
    _require_emulator()
    from relevo_local.state_dir import running

    holder = running(state_dir)
    if holder is None:
        raise typer.Exit(_say_not_running(state_dir))
    if holder.pid <= 0:
        raise UserMistake(f"the local stack on {state_dir} is still starting; try again in a moment")
    os.kill(holder.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_sec
    while running(state_dir) is not None:
        if time.monotonic() > deadline:
            _say(f"pid {holder.pid} still runs after {timeout_sec:g}s; `kill -9 {holder.pid}` ends it")
            raise typer.Exit(1)
        time.sleep(0.1)
    _say(f"local stack on {state_dir} stopped (pid {holder.pid}, up {_duration(holder.uptime_sec)})")


@local_app.command("agent")
def local_agent(
    region: str = typer.Option(
        ...,
        "--region",
        "--region-affinity",
        help="the region affinity whose work queue it polls (eu-west: a name of the stack's "
        "RegionAffinities, not an AWS region)",
    ),
    capacity: int = typer.Option(2, "--capacity", min=1, help="stages at once"),
    agent_id: str | None = typer.Option(
        None, "--agent-id", help="its name (default: local-REGION-N, the first free N)"
    ),
    label: list[str] | None = typer.Option(
        None,
        "--label",
        metavar="KEY=VALUE",
        help="a fact of this agent a stage's `requires` can name, e.g. --label bay=build (repeatable; the "
        "TOML's labels)",
    ),
    state_dir: Path = StateDirOption,
) -> None:
    """Run a relevo-agent against the local stack in the foreground (its TOML, workspaces, journal:
    STATE_DIR/agents/ID/)."""
    from relevo_local.processes import write_agent_config

    labels = agent_labels(label or [])
    holder, stack = _running_stack(state_dir)
    if stack is None:
        raise UserMistake(
            f"the local stack on {state_dir} is still starting; try again once `relevo local status` shows "
            "its API"
        )
    if region not in stack.work_queues:
        raise UserMistake(
            f"region {region!r} has no work queue in the local stack; its regions: "
            f"{', '.join(sorted(stack.work_queues))} "
            "(`relevo local up --region-affinities a,b` chooses them)"
        )
    try:
        import relevo_agent.launch  # noqa: F401  (only to say clearly when it is missing)
    except ImportError as exc:
        raise UserMistake("relevo-agent is not installed beside this CLI (pip install ./agent)") from exc
    home, lock_fd = _agent_home(state_dir, region, agent_id)
    settings: dict[str, Any] = {"labels": labels} if labels else {}
    config = write_agent_config(
        home / "agent.toml",
        (state_dir / "stack.json").resolve(),
        region,
        home.name,
        capacity=capacity,
        **settings,
    )
    said_labels = f", labels {', '.join(f'{key}={value}' for key, value in labels.items())}" if labels else ""
    _say(
        f"agent {home.name} (region affinity {region}, capacity {capacity}{said_labels}) on the local stack "
        f"{stack.api_url}; "
        f"config {config}; it stays across a restart of the stack; Ctrl-C stops it"
    )
    sys.stdout.flush()
    # The agent itself, in this process: signals reach it directly (its staged shutdown), and the
    # lock on its directory is inherited so no second agent takes the same id meanwhile. It follows
    # the stack file: a restarted stack (a new one on this state dir) is joined, not a reason to exit.
    os.set_inheritable(lock_fd, True)
    os.execv(
        sys.executable,
        [sys.executable, "-m", "relevo_agent.launch", "--config", str(config), "--follow-stack"],
    )


# The agent config's limits on labels (relevo_agent.config AgentConfig.labels), checked here so a
# mistake is one line before anything is written or started.
_MAX_LABELS = 32
_MAX_LABEL_VALUE = 64


def agent_labels(given: list[str]) -> dict[str, str]:
    """`--label KEY=VALUE` options as the TOML's `labels`: each key a requirement key
    (relevo_core.models.capabilities), each given once. A key the agent detects (os, arch, macos,
    xcode) counts only where it detects nothing (a label never overrides a detected fact): on a
    Linux machine `--label xcode=16.2` stands in for a Mac's Xcode."""
    import re

    from relevo_core.models.capabilities import REQUIREMENT_KEY

    labels: dict[str, str] = {}
    for text in given:
        key, equals, value = text.partition("=")
        key, value = key.strip(), value.strip()
        if not equals or not key or not value:
            raise UserMistake(f"--label {text!r}: give it as KEY=VALUE, e.g. --label bay=build")
        if not re.fullmatch(REQUIREMENT_KEY, key):
            raise UserMistake(
                f"--label {text!r}: {key!r} is not a label key (a lowercase letter, then up to 31 of a-z, "
                "0-9, _ and -)"
            )
        if len(value) > _MAX_LABEL_VALUE:
            raise UserMistake(
                f"--label {key}=…: its value is {len(value)} characters, at most {_MAX_LABEL_VALUE}"
            )
        if key in labels:
            raise UserMistake(f"--label {key}: given twice ({key}={labels[key]} and {key}={value})")
        labels[key] = value
    if len(labels) > _MAX_LABELS:
        raise UserMistake(f"--label: {len(labels)} labels, at most {_MAX_LABELS}")
    return labels


def _agent_home(state_dir: Path, region: str, agent_id: str | None) -> tuple[Path, int]:
    """STATE_DIR/agents/ID, locked for this agent: the id asked for, or local-REGION-N, the first N
    whose directory no running agent holds."""
    from relevo_local.state_dir import try_lock

    candidates = [agent_id] if agent_id else [f"local-{region}-{n}" for n in range(1, 100)]
    for name in candidates:
        home = state_dir / "agents" / name
        home.mkdir(parents=True, exist_ok=True)
        fd = try_lock(home / "agent.lock")
        if fd is not None:
            return home, fd
    raise UserMistake(f"agent {agent_id} already runs on this state dir" if agent_id else "no free agent id")
