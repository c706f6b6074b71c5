"""`relevo-tools drill`: the disaster drill.

    relevo-tools drill all --trials 3
    relevo-tools drill partition freeze --trials 5 --stack-file .relevo/local/stack.json
    relevo-tools drill release          # its three faults, 5 trials each

It starts a local stack (or uses the one named), two relevo-agent processes of one region (a
third for the parallel drill), each behind a loopback fault proxy, and runs the named drills, N
trials each; it prints a table per drill and a summary, and exits 1 on any duplicate or lost
effect, wrongly failed job, stage left non-terminal, slow cancel or sibling stop or incomplete
dead-letter entry (2 on a bad argument).

A development tool, not the operator CLI's: it needs the emulator (relevo-local) and the agent,
which an operator install of relevo-cli does not have.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

import typer
from rich.console import Console

from relevo_core.files.stack import StackInfo, load_stack
from relevo_local.processes import local_stack
from relevo_tools.drill.drills import DEFAULT_TRIALS, DRILLS, GROUPS
from relevo_tools.drill.fleet import DrillTiming
from relevo_tools.drill.report import drill_table, release_table, summary_table
from relevo_tools.drill.runner import run_drills

console = Console(width=None if sys.stdout.isatty() or "COLUMNS" in os.environ else 160)


def drill_command(
    drills: list[str] = typer.Argument(
        ..., help="drills to run by name, or all (a name it does not know lists them)"
    ),
    trials: int | None = typer.Option(
        None, "--trials", min=1, max=50, help="trials of each drill (default 1; the release drills 5)"
    ),
    stack_file: Path | None = typer.Option(
        None, "--stack-file", help="use this stack.json instead of starting a local stack"
    ),
    lease: int | None = typer.Option(
        None, "--lease", min=3, max=120, help="lease_ttl_sec of the drill's projects (default 6)"
    ),
    effect_after: float | None = typer.Option(
        None, "--effect-after", min=1, help="when the faulted stage's effect lands (default 10 s)"
    ),
    fast: bool = typer.Option(False, "--fast", help="short leases and stages (what make test runs)"),
    work_dir: Path | None = typer.Option(
        None, "--work-dir", help="where agent logs, journals and effects go (default: a new temp dir)"
    ),
) -> None:
    """Run disaster drills against two agents behind fault proxies; exit 1 if any effect ran twice or got
    lost."""
    names = list(DRILLS) if drills == ["all"] else [n for name in drills for n in GROUPS.get(name, [name])]
    unknown = [name for name in names if name not in DRILLS]
    if unknown:
        typer.echo(
            f"relevo-tools drill: unknown drill {unknown[0]!r}; choose from {', '.join([*DRILLS, *GROUPS])} "
            "or all",
            err=True,
        )
        raise typer.Exit(2)
    names = list(dict.fromkeys(names))
    counts = {name: trials or DEFAULT_TRIALS.get(name, 1) for name in names}
    timing = DrillTiming.fast() if fast else DrillTiming()
    if lease is not None or effect_after is not None:
        timing = DrillTiming(
            lease_ttl_sec=lease or timing.lease_ttl_sec,
            effect_after_sec=effect_after
            or max(timing.effect_after_sec, (lease or timing.lease_ttl_sec) + 4),
            kill_grace_sec=timing.kill_grace_sec,
            max_clock_skew_sec=timing.max_clock_skew_sec,
        )
    work = Path(tempfile.mkdtemp(prefix="relevo-drill-")) if work_dir is None else work_dir
    work.mkdir(parents=True, exist_ok=True)
    console.print(
        f"[bold]relevo-tools drill[/bold] {' '.join(f'{n} × {counts[n]}' for n in names)}"
        f" (lease {timing.lease_ttl_sec}s,"
        f" effect {timing.effect_after_sec:g}s in; logs in {work})"
    )
    with ExitStack() as running:
        stack = _stack(running, stack_file, work)
        stack.apply_to_environment()
        results = run_drills(
            names,
            counts,
            timing,
            stack,
            work,
            say=lambda line: console.print(f"[dim]{line}[/dim]"),
            on_trial=lambda t: console.print(
                f"  {'✓' if t.ok else '✗'} {t.drill} {t.number}: {t.outcome}"
                + "".join(f"\n    {p}" for p in t.problems)
            ),
        )
    for name, done in results.items():
        console.print(drill_table(name, done))
    console.print(summary_table(results))
    released = release_table(results)
    if released is not None:
        console.print(released)
    failed = [t for done in results.values() for t in done if not t.ok]
    if failed:
        console.print(f"[red]✗ {len(failed)} trial(s) did not hold (logs in {work})[/red]")
        raise typer.Exit(1)
    console.print(
        "[green]✓ every trial held: no duplicate or lost effect, no wrongly failed job, no stage left "
        "non-terminal[/green]"
    )
    if work_dir is None:
        shutil.rmtree(work, ignore_errors=True)


def _stack(running: ExitStack, stack_file: Path | None, work: Path) -> StackInfo:
    if stack_file is not None:
        try:
            return load_stack(stack_file)
        except FileNotFoundError as exc:
            typer.echo(f"relevo-tools drill: {exc}", err=True)
            raise typer.Exit(2) from exc
    console.print("[dim]starting a local stack (as relevo local up does)…[/dim]")
    return running.enter_context(local_stack(work / "stack", work / "local-up.log"))
