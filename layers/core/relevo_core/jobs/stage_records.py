"""What one stage (or shard) record says, as the job view shows it: the attempt that ran last,
its transfers, tests, handoff, values and warning (relevo_core.jobs.view puts them together)."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from relevo_core.models.cache import CacheOutcome
from relevo_core.models.effect_summary import stage_values
from relevo_core.models.status import SUCCEEDED_STAGE, StageStatus
from relevo_core.models.transfer import TransferProgress

# What one stage record says of the attempt that ran last; attempts_log keeps every attempt.
ATTEMPT_FIELDS = ("agent_id", "exit_code", "error_class", "enqueued_at", "started_at", "ended_at")


def current_attempt(record: dict[str, Any]) -> dict[str, Any]:
    """A stage record between a failed attempt and the claim of its retry still holds the failed
    attempt's claim (attempt, agent, timings, error): the state machine writes only
    dispatched_attempt when it dispatches the retry. The view shows the retry as it is, waiting
    for a claim, and leaves the failed attempt to attempts_log."""
    dispatched, claimed = record.get("dispatched_attempt"), record.get("attempt")
    if (
        record.get("status") != StageStatus.DISPATCHED.value
        or dispatched is None
        or claimed is None
        or dispatched <= claimed
    ):
        return record
    return {
        **{name: value for name, value in record.items() if name not in ATTEMPT_FIELDS},
        "attempt": dispatched,
    }


def transfers_of(record: dict[str, Any]) -> dict[str, Any]:
    """`transfers` (every attempt's, by attempt) and `transfer` (the shown attempt's, or None)."""
    transfers = sorted(
        (TransferProgress.model_validate(value) for value in (record.get("transfers") or {}).values()),
        key=lambda transfer: transfer.attempt,
    )
    current = next((transfer for transfer in transfers if transfer.attempt == record.get("attempt")), None)
    return {
        "transfers": [transfer.model_dump(mode="json") for transfer in transfers],
        "transfer": current.model_dump(mode="json") if current else None,
    }


def tests_of(record: dict[str, Any]) -> dict[str, Any] | None:
    """The last attempt's ResultsSummary, as the outcome route recorded it (None without one)."""
    tests = record.get("tests")
    return tests if isinstance(tests, dict) else None


def handoff_of(record: dict[str, Any]) -> dict[str, Any] | None:
    """What the stage handed on (its receipt's summary; while it runs, the attempt's stored one)
    and what its Mac restored before its command: `files`/`bytes` handed on, `restored_bytes`
    downloaded (0 when everything was already on that Mac)."""
    receipt = given if isinstance(given := record.get("receipt"), dict) else {}
    stored = receipt.get("handoff") or record.get("handoff_stored")
    restored = given if isinstance(given := record.get("restored"), dict) else None
    if not stored and not restored:
        return None
    view: dict[str, Any] = {}
    if stored:
        view.update(
            {
                name: stored.get(name)
                for name in (
                    "files",
                    "dirs",
                    "symlinks",
                    "bytes",
                    "uploaded_bytes",
                    "digest",
                    "manifest",
                    "stored_at",
                    "attempt",
                )
            }
        )
        view["cross_region_bytes"] = stored.get("cross_region_bytes")
    if restored:
        view["restored"] = restored
        view["restored_bytes"] = restored.get("restored_bytes", 0)
        view["restored_files"] = restored.get("files", 0)
        view["restored_digest"] = restored.get("digest")
    return view


def caches_of(record: dict[str, Any]) -> list[dict[str, Any]]:
    """What became of the attempt's caches (relevo_core.models.cache.CacheOutcome, as its agent
    recorded them): hit, partial hit or miss with bytes and seconds, and what the save did. An
    outcome that is not one (a record of an older agent) is left out, not shown half."""
    shown = []
    for given in record.get("caches") or []:
        try:
            shown.append(CacheOutcome.model_validate(given).model_dump(mode="json"))
        except ValidationError:
            continue
    return shown


def outputs_of(record: dict[str, Any]) -> dict[str, str]:
    """The stage's $RELEVO_OUTPUT values: its receipt's once it succeeded, else as recorded so far."""
    return stage_values(record)


def warning_of(record: dict[str, Any]) -> str | None:
    if record.get("status") != StageStatus.WARNING.value:
        return None
    receipt = given if isinstance(given := record.get("receipt"), dict) else {}
    warnings = given if isinstance(given := receipt.get("warnings"), dict) else {}
    return str(warnings.get("text") or "its command marked warnings")


def last_successful(record: dict[str, Any], stages: list[dict[str, Any]]) -> str | None:
    ran = [
        stage["name"]
        for stage in stages
        if stage["status"] in SUCCEEDED_STAGE and stage["reused_from"] is None
    ]
    return ran[-1] if ran else record.get("last_successful_stage")
