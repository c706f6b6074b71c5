"""The kill-stage drill's fault on a stage whose leader is already gone: a trial whose premise
never held (run again by the runner), not a drill error counted against Relevo."""

from __future__ import annotations

import subprocess

import pytest

from relevo_tools.drill.fleet import StageStart
from relevo_tools.drill.stage_faults import kill_stage_leader
from relevo_tools.drill.trial import LateFault


def _exited_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()  # reaped: its pid names no process now
    return process.pid


def test_a_stage_leader_already_gone_makes_the_trial_a_late_fault() -> None:
    start = StageStart(operation_id="job:deliver", attempt=1, pgid=_exited_pid(), at=0.0)
    with pytest.raises(LateFault, match="already exited"):
        kill_stage_leader(None, start)


def test_a_running_stage_leader_is_killed() -> None:
    process = subprocess.Popen(["sleep", "30"])
    try:
        kill_stage_leader(None, StageStart(operation_id="job:deliver", attempt=1, pgid=process.pid, at=0.0))
        assert process.wait(timeout=10) == -9
    finally:
        process.kill()
