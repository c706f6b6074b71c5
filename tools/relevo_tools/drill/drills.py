"""The drills by name: each trial runs one job (exhaust: the job and its redrive) through a fault
and judges what happened. A trial's problems are what `relevo-tools drill` fails on (trial.py)."""

from __future__ import annotations

from relevo_tools.drill.handoff import handoff
from relevo_tools.drill.parallel import parallel
from relevo_tools.drill.stage_faults import (
    cancel,
    exhaust,
    freeze,
    kill,
    kill_stage,
    latency,
    partition,
    resets,
    short_partition,
)
from relevo_tools.drill.trial import Drill

DRILLS: dict[str, Drill] = {
    "partition": partition,
    "short-partition": short_partition,
    "freeze": freeze,
    "kill": kill,
    "kill-stage": kill_stage,
    "resets": resets,
    "latency": latency,
    "cancel": cancel,
    "exhaust": exhaust,
    "handoff": handoff,
    "parallel": parallel,
}
