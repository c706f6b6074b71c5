"""What a claimed stage stands on: the Mac that holds the earlier stages' files, and the jobs a
job started from a later stage stands on (fleet/claims)."""

from __future__ import annotations

from typing import Any

from relevo_core.jobs.handoff_sources import MAX_LINEAGE
from relevo_core.models.envelope import JobEnvelope
from relevo_core.models.errors import RelevoError
from relevo_core.store.jobs import get_envelope


def holds_files(record: dict[str, Any]) -> bool:
    """Whether the Mac that ran a stage (by its record) holds files a later stage restores: the
    handoff it stored (its receipt's summary, or the attempt's stored one) or the earlier stages'
    files it restored."""
    receipt = given if isinstance(given := record.get("receipt"), dict) else {}
    stored = receipt.get("handoff") or record.get("handoff_stored")
    restored = record.get("restored")
    counted = [
        int(found.get(name) or 0)
        for found in (stored, restored)
        if isinstance(found, dict)
        for name in ("files", "symlinks")
    ]
    return sum(counted) > 0


def lineage_of(table: str, envelope: JobEnvelope) -> list[str]:
    """The jobs whose stages a job started from a later stage stands on (retry_of, and theirs
    while they skipped stages too), nearest first: what its agents may read for the handoff."""
    found: list[str] = []
    current = envelope
    while current.first_stage_index > 0 and current.retry_of and len(found) < MAX_LINEAGE:
        found.append(current.retry_of)
        try:
            current = get_envelope(table, current.retry_of)
        except RelevoError:
            break  # deleted: nothing of it is read
    return found
