"""The emulator's deployed heap out of full collections while a stack runs (relevo_local.heap):
frozen when a stack is deployed, the youngest generation collected less often, what is made later
still collected, and the last stack's stop gives everything back to the collector as it was.

Run in a process of its own: a test session's stack holds the heap of its worker.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import gc
    from relevo_local import heap

    gc.disable()  # only the collections this script asks for
    assert not heap.held() and gc.get_freeze_count() == 0
    before = gc.get_threshold()
    deployed = [[n] for n in range(5000)]
    heap.hold()
    assert heap.held()
    assert gc.get_threshold() == (heap.YOUNG_THRESHOLD, *before[1:]), gc.get_threshold()
    frozen_at_start = gc.get_freeze_count()
    assert frozen_at_start >= 5000, frozen_at_start
    assert not any(o is deployed for o in gc.get_objects()), "the deployed heap is frozen"

    made_since = [[n] for n in range(3000)]
    gc.collect()
    assert any(o is made_since for o in gc.get_objects()), "what is made later is walked, not frozen"
    assert gc.get_freeze_count() == frozen_at_start
    cycle = []
    cycle.append(cycle)
    del cycle
    assert gc.collect() >= 1, "garbage made since the freeze is collected"

    heap.hold()  # a second stack in the process
    heap.release()
    assert heap.held() and gc.get_freeze_count() > 0, "one stack still up"
    heap.release()
    assert not heap.held() and gc.get_freeze_count() == 0
    assert gc.get_threshold() == before
    assert any(o is deployed for o in gc.get_objects())
    heap.release()  # more releases than holds change nothing
    assert not heap.held()
    print("held")
    """
)


def test_the_deployed_heap_is_frozen_while_a_stack_runs_and_given_back_when_the_last_stops() -> None:
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "held"
