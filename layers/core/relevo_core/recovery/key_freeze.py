"""The dead-letter freeze: an idempotency key that keeps dead-lettering stops being retried
automatically until an operator lifts it.

- An entry is one dead-lettered job of the key (the entry the state machine records; a repeat of
  that step rewrites the same entry, so it counts once).
- The key is frozen when an entry is recorded and, counting it, more than FREEZE_AFTER entries of
  the key failed within FREEZE_WINDOW before it (and after the key's last unfreeze: an unfreeze
  starts the count afresh). The window is anchored on the entries' own failure times, so the
  decision is the same whenever it is made.
- While frozen: stage retries of the key's jobs run one attempt (the state machine reads the
  freeze), and automatic runs of the key (webhook and schedule triggers) are refused with
  KEY_FROZEN (409). A person's explicit redrive, rerun, run or release still goes: it is how a fix
  is tried, and its stages still get a single attempt while the key is frozen.
- The owner is notified once per freeze through the project notification topic (SNS).

The decision runs in the sweep (every minute): the state machine marks each entry it records,
and the sweep decides for each marked entry, then clears the mark. Only the call whose
conditional write froze the key publishes; a freeze whose notification was lost (a crash between
the two) is published again by a later sweep.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote

from relevo_core.aws import client
from relevo_core.config import TableSettings
from relevo_core.observability import logger
from relevo_core.store import freezes

FREEZE_WINDOW = timedelta(hours=24)
# More than this many entries inside the window freeze the key.
FREEZE_AFTER = 2
# A freeze still not notified this long after it was made lost its notification: publish again.
RENOTIFY_AFTER = timedelta(minutes=5)


def _at(value: str) -> datetime:
    parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def counted_entries(
    entries: list[dict[str, Any]], at: datetime, unfrozen_at: datetime | None
) -> list[dict[str, Any]]:
    """The entries that count towards a freeze decided at `at`, oldest first."""
    since = at - FREEZE_WINDOW
    if unfrozen_at is not None and unfrozen_at > since:
        since = unfrozen_at
    return sorted((e for e in entries if since < _at(e["failed_at"]) <= at), key=lambda e: e["failed_at"])


def decide_freeze(table: str, entry: dict[str, Any]) -> dict[str, Any] | None:
    """Freeze the entry's key if it has now dead-lettered more than FREEZE_AFTER times in the
    window. Returns the freeze record when this call froze it."""
    idempotency_key = entry["idempotency_key"]
    at = _at(entry["failed_at"])
    record = freezes.get_freeze(table, idempotency_key)
    if "frozen_at" in record:
        return None
    unfrozen_at = _at(record["unfrozen_at"]) if record.get("unfrozen_at") else None
    counted = counted_entries(freezes.entries_of_key(table, idempotency_key), at, unfrozen_at)
    if len(counted) <= FREEZE_AFTER:
        return None
    summary = [{"job_id": e["job_id"], "failed_at": e["failed_at"], "error": e.get("error")} for e in counted]
    frozen_at = datetime.now(UTC)
    if not freezes.freeze(
        table, idempotency_key, entry["project"], summary, frozen_at, int(record.get("version", 0))
    ):
        return None  # frozen (or unfrozen) by someone else meanwhile: they decide and notify
    return {
        "idempotency_key": idempotency_key,
        "project": entry["project"],
        "entries": summary,
        "frozen_at": frozen_at.isoformat(),
    }


def notification(frozen: dict[str, Any]) -> dict[str, Any]:
    key = frozen["idempotency_key"]
    return {
        "event": "dlq.key_frozen",
        "project": frozen["project"],
        "idempotency_key": key,
        "frozen_at": frozen["frozen_at"],
        "entries": frozen["entries"],
        "rule": f"more than {FREEZE_AFTER} dead-letter entries of one idempotency key within {FREEZE_WINDOW}",
        "blocked": "stage retries (one attempt each) and automatic runs (webhook, schedule) of this key",
        "unfreeze": {
            "cli": f"relevo dlq unfreeze '{key}'",
            "api": f"POST /dlq/keys/{quote(key, safe='')}/unfreeze",
        },
    }


def _notify(table: str, topic_arn: str, frozen: dict[str, Any]) -> None:
    client("sns").publish(
        TopicArn=topic_arn, Subject="Relevo dlq.key_frozen", Message=json.dumps(notification(frozen))
    )
    freezes.mark_notified(table, frozen["idempotency_key"], frozen["frozen_at"], datetime.now(UTC))


def evaluate_pending(table: str, topic_arn: str, now: datetime) -> list[str]:
    """Decide every dead-letter entry not yet decided; notify each new freeze once. Returns the
    keys this call froze."""
    newly_frozen: list[str] = []
    for entry in freezes.pending_checks(table):
        frozen = decide_freeze(table, entry)
        if frozen is not None:
            newly_frozen.append(frozen["idempotency_key"])
            _notify(table, topic_arn, frozen)
            logger.warning(
                "idempotency key frozen",
                extra={"idempotency_key": frozen["idempotency_key"], "project": frozen["project"]},
            )
        freezes.clear_check(table, entry["job_id"])
    for record in freezes.frozen_keys(table):
        if "notified_at" not in record and _at(record["frozen_at"]) < now - RENOTIFY_AFTER:
            _notify(table, topic_arn, record)
    return newly_frozen


def describe_frozen(record: dict[str, Any]) -> dict[str, Any]:
    return {
        "idempotency_key": record["idempotency_key"],
        "project": record.get("project"),
        "frozen_at": record.get("frozen_at"),
        "entries": record.get("entries", []),
        "notified_at": record.get("notified_at"),
    }


def project_of_key(idempotency_key: str) -> str:
    """The project an idempotency key belongs to (intake builds keys as project:identity:artifacts)."""
    return idempotency_key.split(":", 1)[0]


def list_frozen_keys(
    settings: TableSettings, can_view: Callable[[str], bool] = lambda _project: True
) -> list[dict[str, Any]]:
    """Frozen keys of the projects the caller may view, newest freeze first."""
    frozen = (describe_frozen(r) for r in freezes.frozen_keys(settings.table_name))
    visible = [r for r in frozen if can_view(r["project"] or project_of_key(r["idempotency_key"]))]
    return sorted(visible, key=lambda r: r["frozen_at"] or "", reverse=True)


def unfreeze_key(settings: TableSettings, idempotency_key: str, actor: str) -> dict[str, Any]:
    """Lift a freeze: automatic runs and stage retries of the key resume; entries before now no
    longer count towards the next freeze. Who may is the caller's to check (dead_letters)."""
    was = freezes.unfreeze(settings.table_name, idempotency_key, actor, datetime.now(UTC))
    logger.info("idempotency key unfrozen", extra={"idempotency_key": idempotency_key, "actor": actor})
    return {
        "idempotency_key": idempotency_key,
        "unfrozen": True,
        "was_frozen_at": was.get("frozen_at"),
        "by": actor,
    }
