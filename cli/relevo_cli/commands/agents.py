"""`relevo agents`: the fleet per region affinity."""

from __future__ import annotations

import json
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from relevo_cli.commands.common import StackOption, console, open_stack, stack_api


def _ago(iso: str) -> str:
    seconds = max(0, int((datetime.now(timezone.utc) - datetime.fromisoformat(iso)).total_seconds()))
    return f"{seconds}s ago" if seconds < 120 else f"{seconds // 60}m ago" if seconds < 7200 else f"{seconds // 3600}h ago"


def agents_command(
    as_json: bool = typer.Option(False, "--json", help="print the fleet as JSON"),
    stack_file: Optional[Path] = StackOption,
) -> None:
    """The fleet per region affinity: each agent online or offline, last seen, capacity used / total, the stages it runs, its version."""
    stack = open_stack(stack_file)
    with stack_api(stack_file) as api:
        agents = api.queue()["agents"]
    regions = sorted(set(stack.work_queues) | {agent["region"] for agent in agents})
    if as_json:
        sys.stdout.write(json.dumps({region: [a for a in agents if a["region"] == region] for region in regions}, indent=2) + "\n")
        return
    for region in regions:
        here = [agent for agent in agents if agent["region"] == region]
        online = [agent for agent in here if agent["online"]]
        table = Table(title=f"{region}: {len(online)} of {len(here)} agent(s) online")
        for column in ("agent", "state", "last seen", "used / capacity", "running stages", "version"):
            table.add_column(column)
        for agent in here:
            stages = ", ".join(f"{s['job_id']} {s['stage']}#{s['attempt']}" for s in agent.get("running_stages", []))
            table.add_row(
                agent["agent_id"], "[green]online[/green]" if agent["online"] else "[red]offline[/red]",
                f"{agent['last_seen'][:19]} ({_ago(agent['last_seen'])})", f"{agent['used']} / {agent['capacity']}",
                stages or "-", agent["version"],
            )
        if here:
            console.print(table)
        else:
            console.print(f"{region}: no agents (a local one: relevo local agent --region {region})", markup=False, highlight=False, soft_wrap=True)
