"""`relevo-tools drill`'s tables: one per drill (a row per trial), then a summary with one row per drill."""

from __future__ import annotations

from rich.table import Table

from relevo_tools.drill.release import RELEASE_DRILLS
from relevo_tools.drill.trial import Trial

# What a problem line starts with -> the summary column that counts it.
PROBLEM_KINDS = {
    "duplicate effect": "duplicates",
    "lost effect": "lost",
    "wrongly failed job": "wrongly failed",
    "non-terminal stage": "non-terminal",
}


def _seconds(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}s"


def _effects(trial: Trial) -> str:
    """Effects per operation, by stage name (deliver, announce), per job of the trial."""
    by_job: dict[str, list[str]] = {}
    for operation, count in trial.effects.items():
        job_id, stage = operation.split(":", 1)
        by_job.setdefault(job_id, []).append(f"{stage} {count}")
    return "\n".join(" · ".join(parts) for parts in by_job.values())


def drill_table(name: str, trials: list[Trial]) -> Table:
    table = Table(title=f"drill {name}", title_justify="left")
    timed = {"cancel": "cancel→SIGTERM", "parallel": "failure→siblings stopped"}.get(name, "fence")
    for column in ("trial", "outcome", "effects per operation", "attempts", "takeover", timed, "problems"):
        table.add_column(column)
    for trial in trials:
        timing = trial.cancel_sec if name == "cancel" else trial.fence_sec
        table.add_row(
            f"{'✓' if trial.ok else '✗'} {trial.number}",
            trial.outcome,
            _effects(trial),
            str(trial.attempts),
            _seconds(trial.takeover_sec),
            _seconds(timing),
            "\n".join(trial.problems) or "none",
        )
    return table


def counts(trials: list[Trial]) -> dict[str, int]:
    found = {column: 0 for column in PROBLEM_KINDS.values()}
    found["other"] = 0
    for trial in trials:
        for problem in trial.problems:
            kind = next(
                (column for prefix, column in PROBLEM_KINDS.items() if problem.startswith(prefix)), "other"
            )
            found[kind] += 1
    return found


def _range(values: list[float]) -> str:
    if not values:
        return "—"
    ordered = sorted(values)
    middle = ordered[len(ordered) // 2]
    return f"{middle:.1f}s (max {ordered[-1]:.1f}s)" if len(ordered) > 1 else f"{middle:.1f}s"


def summary_table(results: dict[str, list[Trial]]) -> Table:
    table = Table(title="drill summary", title_justify="left")
    columns = (
        "drill",
        "trials",
        "held",
        *PROBLEM_KINDS.values(),
        "other",
        "takeover (median)",
        "fence / cancel / stop (median)",
    )
    for column in columns:
        table.add_column(column)
    for name, trials in results.items():
        found = counts(trials)
        fences = [t.cancel_sec if name == "cancel" else t.fence_sec for t in trials]
        table.add_row(
            name,
            str(len(trials)),
            str(sum(t.ok for t in trials)),
            *(str(found[column]) for column in (*PROBLEM_KINDS.values(), "other")),
            _range([t.takeover_sec for t in trials if t.takeover_sec is not None]),
            _range([f for f in fences if f is not None]),
        )
    return table


def release_table(results: dict[str, list[Trial]]) -> Table | None:
    """The release drills by their fault: trials held, duplicate uploads or submissions at the local
    Apple service, in-progress submissions resumed, build numbers given twice. None without them."""
    ran = {name: trials for name, trials in results.items() if name in RELEASE_DRILLS}
    if not ran:
        return None
    table = Table(title="release drill (at the local Apple service)", title_justify="left")
    for column in ("fault", "trials", "held", "duplicates", "resumed", "build numbers given twice"):
        table.add_column(column)
    for name, trials in ran.items():
        found = counts(trials)
        twice = sum(p.startswith("build number given twice") for t in trials for p in t.problems)
        table.add_row(
            name,
            str(len(trials)),
            str(sum(t.ok for t in trials)),
            str(found["duplicates"]),
            str(sum(t.resumed for t in trials)),
            str(twice),
        )
    return table
