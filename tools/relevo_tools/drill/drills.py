"""The drills by name: each trial runs one job (exhaust: the job and its redrive) through a fault
and judges what happened. A trial's problems are what `relevo-tools drill` fails on (trial.py)."""

from __future__ import annotations

from relevo_tools.drill.handoff import handoff
from relevo_tools.drill.parallel import parallel
from relevo_tools.drill.release import RELEASE_DRILLS
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
    **RELEASE_DRILLS,
}
# A name for several drills: `relevo-tools drill release` runs its three faults.
GROUPS: dict[str, list[str]] = {"release": list(RELEASE_DRILLS)}
# Trials of a drill when --trials is not given.
DEFAULT_TRIALS: dict[str, int] = {name: 5 for name in RELEASE_DRILLS}
