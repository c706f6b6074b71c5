"""The partition and freeze drills' judgment of what came after the takeover: the other Mac's
attempt is the last one, unless its own lease lapsed on a loaded machine (a stalled stack, the
trial run again); any other later failure is a problem of the trial."""

from __future__ import annotations

from typing import Any

import pytest

from relevo_core.models.errors import ErrorClass
from relevo_tools.drill.stage_faults import judge_takeover
from relevo_tools.drill.trial import StalledFleet, Trial


def _job(*failed: dict[str, Any]) -> dict[str, Any]:
    return {"stages": [{"name": "deliver", "attempt": len(failed) + 1, "attempts_log": list(failed)}]}


def _failed(attempt: int, agent: str, error: str) -> dict[str, Any]:
    return {
        "attempt": attempt,
        "agent": agent,
        "error": error,
        "cause": "-",
        "at": "2026-12-07T00:00:00+00:00",
    }


FAULTED = _failed(1, "drill-a", ErrorClass.LEASE_EXPIRED)


def test_a_takeover_that_was_the_last_attempt_holds() -> None:
    trial = Trial("partition", 1)
    judge_takeover(trial, _job(FAULTED), "drill-a")
    assert trial.ok


def test_a_takeover_whose_lease_lapsed_on_the_live_mac_is_a_stalled_fleet() -> None:
    with pytest.raises(StalledFleet, match="drill-b"):
        judge_takeover(
            Trial("freeze", 1), _job(FAULTED, _failed(2, "drill-b", ErrorClass.LEASE_EXPIRED)), "drill-a"
        )


@pytest.mark.parametrize(
    "later",
    [
        _failed(2, "drill-b", "Relevo.Transient.ExitCode"),  # it failed for another reason
        _failed(2, "drill-a", ErrorClass.LEASE_EXPIRED),  # the faulted Mac took it back and lapsed
    ],
)
def test_any_other_failure_after_the_takeover_is_a_problem(later: dict[str, Any]) -> None:
    trial = Trial("partition", 1)
    judge_takeover(trial, _job(FAULTED, later), "drill-a")
    assert trial.problems == [f"the takeover did not hold: attempts after the first failed ({[later]})"]


def test_a_lapse_beside_another_problem_stands_with_it() -> None:
    # A duplicate effect is never hidden behind a trial run again.
    trial = Trial("partition", 1, problems=["duplicate effect: job:deliver landed 2 times"])
    judge_takeover(trial, _job(FAULTED, _failed(2, "drill-b", ErrorClass.LEASE_EXPIRED)), "drill-a")
    assert len(trial.problems) == 2
