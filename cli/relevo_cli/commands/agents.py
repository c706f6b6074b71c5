"""`relevo agent list|pause|drain|resume` and `relevo region pause|resume`: the fleet per region
affinity, and taking agents (or a region's dispatch) out of rotation. `relevo agent list` (with
pause-region, resume-region) is the older spelling, kept as a hidden alias."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

import typer
from rich.table import Table

from relevo_cli.cli_errors import UserMistake
from relevo_cli.commands.common import StackOption, add_column, console, open_stack, show, stack_api
from relevo_core.models.requests import PAUSE_DEFAULT_SEC, PAUSE_MAX_SEC

agent_app = typer.Typer(
    no_args_is_help=True, help="The fleet's agents: list them; pause, drain and resume one."
)
region_app = typer.Typer(no_args_is_help=True, help="A region affinity's dispatch: pause it, resume it.")
# The older spelling: `relevo agent list` lists, its subcommands act.
agents_app = typer.Typer(help="The fleet per region affinity; pause, drain and resume agents and regions.")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"(\d+)([smhd])")


def parse_duration(text: str) -> int:
    """`90s`, `5m`, `2h`, `1d12h`, or plain seconds: in seconds, between 1 s and 7 days."""
    text = text.strip()
    if text.isdigit():
        seconds = int(text)
    elif re.fullmatch(r"(?:\d+[smhd])+", text):
        seconds = sum(int(n) * _UNITS[unit] for n, unit in _DURATION.findall(text))
    else:
        raise UserMistake(f"--timeout {text!r}: not a duration (write 90s, 5m, 2h, 1d12h or seconds)")
    if not 1 <= seconds <= PAUSE_MAX_SEC:
        raise UserMistake(f"--timeout {text!r}: a pause lasts from 1 s to 7 days ({PAUSE_MAX_SEC} s)")
    return seconds


def _ago(iso: str) -> str:
    seconds = max(0, int((datetime.now(UTC) - datetime.fromisoformat(iso)).total_seconds()))
    return (
        f"{seconds}s ago"
        if seconds < 120
        else f"{seconds // 60}m ago"
        if seconds < 7200
        else f"{seconds // 3600}h ago"
    )


@agents_app.callback(invoke_without_command=True)
def agents_command(
    ctx: typer.Context,
    as_json: bool = typer.Option(False, "--json", help="print the fleet as JSON"),
    stack_file: Path | None = StackOption,
) -> None:
    """The fleet per region affinity: each agent online or offline (paused, draining), last seen, capacity
    used / total, the stages it runs, its version."""
    if ctx.invoked_subcommand is None:
        agent_list(as_json, stack_file)


@agent_app.command("list")
def agent_list(
    as_json: bool = typer.Option(False, "--json", help="print the fleet as JSON"),
    stack_file: Path | None = StackOption,
) -> None:
    """The fleet per region affinity: each agent online or offline (paused, draining), last seen, capacity
    used / total, the stages it runs, its version."""
    work_queues = open_stack(stack_file).work_queues

    def by_region(view: dict) -> dict[str, list[dict]]:
        regions = sorted(set(work_queues) | {agent["region"] for agent in view["agents"]})
        return {region: [a for a in view["agents"] if a["region"] == region] for region in regions}

    def tables(view: dict) -> list[Table | str]:
        paused_regions = {pause["region"]: pause for pause in view.get("paused_regions", [])}
        return [_region_table(region, here, paused_regions) for region, here in by_region(view).items()]

    show(stack_file, lambda api: api.queue(), as_json, tables, as_data=by_region)


def _region_table(region: str, here: list[dict], paused_regions: dict[str, dict]) -> Table | str:
    """A region's agents, or the line that says it has none and how to start one here."""
    if not here:
        return f"{region}: no agents (a local one: relevo local agent --region {region})"
    online = [agent for agent in here if agent["online"]]
    title = f"{region}: {len(online)} of {len(here)} agent(s) online"
    if region in paused_regions:
        title += f"; dispatch {_pause_text(paused_regions[region])}"
    table = Table(title=title)
    for column in (
        "agent",
        "state",
        "last seen",
        "used / capacity",
        "running stages",
        "capabilities",
        "version",
    ):
        add_column(table, column)
    for agent in here:
        stages = ", ".join(
            f"{s['job_id']} {s['stage']}#{s['attempt']}" for s in agent.get("running_stages", [])
        )
        table.add_row(
            agent["agent_id"],
            _state(agent),
            f"{agent['last_seen'][:19]} ({_ago(agent['last_seen'])})",
            f"{agent['used']} / {agent['capacity']}",
            stages or "-",
            _capabilities(agent.get("capabilities")),
            agent["version"],
        )
    return table


def _capabilities(found: dict | None) -> str:
    if not found:
        return "-"
    facts = [f"{found['os']} {found['arch']}"]
    facts += [f"macOS {found['macos']}"] if found.get("macos") else []
    facts += (
        [
            f"Xcode {found['xcode']}"
            + (f" (of {', '.join(found['xcode_versions'])})" if found.get("xcode_versions") else "")
        ]
        if found.get("xcode")
        else []
    )
    facts += [f"{found['free_disk_gb']:g} GB free"] if found.get("free_disk_gb") is not None else []
    facts += [f"{name}={value}" for name, value in sorted(found.get("labels", {}).items())]
    return ", ".join(facts)


def _pause_text(pause: dict) -> str:
    what = "draining" if pause.get("drain") else "paused"
    note = f": {pause['note']}" if pause.get("note") else ""
    return f"{what} until {pause['until'][:19]}{note}"


def _state(agent: dict) -> str:
    if not agent["online"]:
        return "[red]offline[/red]"
    if agent.get("paused"):
        return f"[yellow]{_pause_text(agent['paused'])}[/yellow]"
    if agent.get("not_claiming"):
        return f"[yellow]online, not claiming ({agent['not_claiming']})[/yellow]"
    return "[green]online[/green]"


Note = typer.Option("", "--note", help="why (shown in `relevo agent list`, the console and the queue)")
Timeout = typer.Option(
    f"{PAUSE_DEFAULT_SEC // 60}m",
    "--timeout",
    help="ends by itself after this long (90s, 5m, 2h, 1d; at most 7d)",
)
Region = typer.Option(
    None, "--region", help="the agent's region affinity (default: the region of its presence record)"
)


def _pause(
    agent_id: str, note: str, timeout: str, region: str | None, drain: bool, stack_file: Path | None
) -> None:
    body = {
        "note": note,
        "timeout_sec": parse_duration(timeout),
        "drain": drain,
        **({"region": region} if region else {}),
    }
    with stack_api(stack_file) as api:
        pause = api.pause_agent(agent_id, body)["paused"]
    then = "finishes what it runs, then exits" if drain else "finishes what it runs"
    console.print(
        f"{agent_id} ({pause['region']}) {_pause_text(pause)}: takes no new stage within a presence "
        f"interval, {then}",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )


@agent_app.command("pause")
@agents_app.command("pause")
def pause_command(
    agent_id: str = typer.Argument(..., help="the agent's id"),
    note: str = Note,
    timeout: str = Timeout,
    region: str | None = Region,
    stack_file: Path | None = StackOption,
) -> None:
    """Stop an agent taking new stages; what it runs finishes. It resumes by itself after --timeout."""
    _pause(agent_id, note, timeout, region, False, stack_file)


@agent_app.command("drain")
@agents_app.command("drain")
def drain_command(
    agent_id: str = typer.Argument(..., help="the agent's id"),
    note: str = Note,
    timeout: str = Timeout,
    region: str | None = Region,
    stack_file: Path | None = StackOption,
) -> None:
    """Pause an agent and have it exit once idle (launchd restarts it paused, until resume or --timeout)."""
    _pause(agent_id, note, timeout, region, True, stack_file)


@agent_app.command("resume")
@agents_app.command("resume")
def resume_command(
    agent_id: str = typer.Argument(..., help="the agent's id"),
    region: str | None = Region,
    stack_file: Path | None = StackOption,
) -> None:
    """End an agent's pause or drain."""
    with stack_api(stack_file) as api:
        result = api.resume_agent(agent_id, region)
    console.print(
        f"{agent_id} ({result['region']}) " + ("resumed" if result["resumed"] else "was not paused"),
        markup=False,
        highlight=False,
    )


@region_app.command("pause")
@agents_app.command("pause-region")
def pause_region_command(
    region: str = typer.Argument(..., help="a region affinity"),
    note: str = Note,
    timeout: str = Timeout,
    stack_file: Path | None = StackOption,
) -> None:
    """Pause dispatch in a region: none of its agents takes a new stage; running stages finish."""
    with stack_api(stack_file) as api:
        pause = api.pause_region(region, {"note": note, "timeout_sec": parse_duration(timeout)})["paused"]
    console.print(f"{region}: dispatch {_pause_text(pause)}", markup=False, highlight=False, soft_wrap=True)


@region_app.command("resume")
@agents_app.command("resume-region")
def resume_region_command(
    region: str = typer.Argument(..., help="a region affinity"), stack_file: Path | None = StackOption
) -> None:
    """End a region's dispatch pause."""
    with stack_api(stack_file) as api:
        result = api.resume_region(region)
    console.print(
        f"{region}: dispatch " + ("resumed" if result["resumed"] else "was not paused"),
        markup=False,
        highlight=False,
    )
