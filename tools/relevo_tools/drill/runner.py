"""The disaster drill's trials: every named drill, N trials each, on one fleet of two agents behind
fault proxies, the fleet settled between trials (`relevo-tools drill`, drill/command.py, runs them)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from relevo_core.files.stack import StackInfo
from relevo_tools.drill.drills import DRILLS
from relevo_tools.drill.fleet import TERMINAL_JOB, DrillFleet, DrillTiming
from relevo_tools.drill.trial import LateFault, Trial


def run_drills(
    names: list[str],
    trials: int | Mapping[str, int],
    timing: DrillTiming,
    stack: StackInfo,
    work: Path,
    say: Callable[[str], None] = lambda _: None,
    on_trial: Callable[[Trial], None] = lambda _: None,
) -> dict[str, list[Trial]]:
    """Every trial of every named drill (`trials` of each, or by name) on one fleet, healed
    between trials."""
    results: dict[str, list[Trial]] = {}
    fleet = DrillFleet(stack, work, timing, say)
    try:
        fleet.start()
        say(f"agents {', '.join(fleet.agents)} online in eu-west, each behind its fault proxy")
        for name in names:
            results[name] = []
            count = trials if isinstance(trials, int) else trials[name]
            for number in range(1, count + 1):
                say(f"{name} trial {number}/{count}…")
                trial = run_trial(fleet, name, number, say)
                results[name].append(trial)
                on_trial(trial)
    finally:
        fleet.close()
    return results


# A trial whose fault came too late (the machine was too loaded to inject it in time) is run
# again, this many times at most, rather than counted.
LATE_FAULT_RETRIES = 2


def run_trial(
    fleet: DrillFleet, name: str, number: int, say: Callable[[str], None] = lambda _: None
) -> Trial:
    """One trial of the drill, run again when its fault came too late to be valid; the fleet is
    settled afterwards (every job ended, every agent back)."""
    for retry in range(LATE_FAULT_RETRIES + 1):
        fleet.last_jobs = []
        try:
            trial = DRILLS[name](fleet, number)
        except LateFault as late:
            _settle(fleet, Trial(name, number, jobs=list(fleet.last_jobs)))
            if retry < LATE_FAULT_RETRIES:
                say(f"{name} trial {number}: {late}; not a valid trial, running it again")
                continue
            trial = Trial(name, number, outcome="not completed", problems=[f"drill error: {late}"])
        except Exception as exc:  # the drill could not observe what it needed
            trial = Trial(
                name, number, outcome="not completed", problems=[f"drill error: {type(exc).__name__}: {exc}"]
            )
        _settle(fleet, trial)
        return trial
    raise AssertionError("unreachable")


def _settle(fleet: DrillFleet, trial: Trial) -> None:
    """Leave nothing of this trial to the next: every job ended, every agent back and online."""
    for job_id in trial.jobs:
        try:
            if fleet.job(job_id)["status"] not in TERMINAL_JOB:
                fleet.api.cancel_job(job_id)
        except Exception:
            pass
    fleet.heal_all()
