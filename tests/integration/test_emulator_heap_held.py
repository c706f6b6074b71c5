"""A running local stack holds its deployed heap out of full collections (relevo_local.heap)."""

from __future__ import annotations

import gc

from relevo_local import heap


def test_a_deployed_stack_holds_its_heap_frozen(local_stack):
    assert heap.held()
    # The deployed emulator: moto's models, the template's resources, the interpreter's parsers.
    assert gc.get_freeze_count() > 100_000, gc.get_freeze_count()
