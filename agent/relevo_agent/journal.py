"""The agent's local journal: SQLite in WAL mode, written before anything is reported.

One row per operation (`operation_id` = job:stage, stable across attempts) holds the attempt this
agent last ran, the resource it touched, the precondition it ran under, the outcome and the
receipt. A result is written here first, in the same SQLite transaction as an outbox entry; the
outbox entry is removed only once the report reached Relevo, so a report lost to a network
failure (or an agent crash) is sent again when the network returns.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import Enum
from pathlib import Path
from typing import Any

from relevo_core.files.private import keep_private, tighten


class OperationOutcome(str, Enum):
    # The command is running (or was, when the agent died): the outcome is not known yet.
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    # The agent gave up the attempt (taken over, canceled, shut down): no result is claimed.
    ABANDONED = "abandoned"
    # The claim was sent and its answer lost (no answer, or the gateway's 5xx): it may have landed
    # on the stage record. Nothing ran under it; the message's next delivery to this agent resumes
    # it when the record names it (relevo_agent.claim).
    UNANSWERED = "unanswered"
    # The lease deadline came before the command ended: it was killed and its result withheld.
    FENCED = "fenced"
    # A reconciliation decided the attempt without running the command.
    RECONCILED = "reconciled"

    @property
    def known(self) -> bool:
        return self in {OperationOutcome.SUCCEEDED, OperationOutcome.FAILED, OperationOutcome.RECONCILED}


@dataclass(frozen=True)
class Operation:
    operation_id: str
    job_id: str
    stage: str
    stage_index: int
    attempt: int
    resource_key: str
    precondition_version: str
    outcome: OperationOutcome = OperationOutcome.RUNNING
    receipt: dict[str, Any] | None = None
    updated_at: str = ""
    pgid: int | None = None
    # What the attempt's command wrote to $RELEVO_OUTPUT, journaled as it came (relevo_agent.outputs).
    outputs: dict[str, str] | None = None
    # The claim's proof (relevo_agent.claim): what gets the attempt's job credentials again
    # after a restart. This file is the agent's alone (docs/agent.md).
    claim_secret: str | None = None
    # The shard of a stage with shards (its record is the shard's: keys.shard_sk).
    shard: int | None = None
    # What this attempt's reconcile decided of the previous one's unknown outcome
    # (relevo_agent.reconcile.ReconcileAction: rerun, resume, ...), journaled before it acts on it.
    reconciled: str | None = None


@dataclass(frozen=True)
class Report:
    """An outbox entry: a result recorded locally and not yet acknowledged by Relevo."""

    id: int
    operation_id: str
    attempt: int
    payload: dict[str, Any]
    tries: int


SHARD_MARK = "#shard-"


def operation_id(job_id: str, stage: str, shard: int | None = None) -> str:
    """The operation an attempt is of: the job's stage, or one shard of it (each shard its own
    operation: its own journal entry, RELEVO_OPERATION_ID and effect probe)."""
    return f"{job_id}:{stage}" + ("" if shard is None else f"{SHARD_MARK}{shard}")


def stage_of(op_id: str) -> str:
    """The stage name an operation id names."""
    return op_id.split(":", 1)[1].split(SHARD_MARK, 1)[0]


_SCHEMA = """
CREATE TABLE IF NOT EXISTS operations (
    operation_id TEXT PRIMARY KEY,
    job_id TEXT NOT NULL,
    stage TEXT NOT NULL,
    stage_index INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    resource_key TEXT NOT NULL,
    precondition_version TEXT NOT NULL,
    outcome TEXT NOT NULL,
    receipt TEXT,
    -- Unused: a run token never leaves the stack (earlier agents kept it here; cleared on open).
    run_token TEXT,
    updated_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    operation_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    payload TEXT NOT NULL,
    tries INTEGER NOT NULL DEFAULT 0,
    created_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (
    name TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
"""
# Columns added after the first release: journals written before them gain them on open.
_ADDED_COLUMNS = {
    "operations": {
        "pgid": "INTEGER",
        "outputs": "TEXT",
        "claim_secret": "TEXT",
        "shard": "INTEGER",
        "reconciled": "TEXT",
    }
}


def _now() -> str:
    return datetime.now(UTC).isoformat()


class Journal:
    """Thread-safe: every stage thread and the outbox flusher share one connection under a lock."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        # 0600 before SQLite opens it: its -wal and -shm files take the database's mode.
        keep_private(path)
        for companion in ("-wal", "-shm"):
            tighten(path.with_name(path.name + companion))
        self.path = path
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        mode = self._db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if mode.lower() != "wal":
            raise RuntimeError(f"journal {path}: SQLite refused WAL mode ({mode})")
        # FULL: a committed result survives a power loss, not only a crash of the agent.
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)
        for table, columns in _ADDED_COLUMNS.items():
            present = {row["name"] for row in self._db.execute(f"PRAGMA table_info({table})")}
            for column, kind in columns.items():
                if column not in present:
                    self._db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
        # A run token is a capability the stack keeps to itself now: none stays on this disk.
        self._db.execute("UPDATE operations SET run_token=NULL WHERE run_token IS NOT NULL")
        # Which journal this is: a claim records it, and a restarted agent takes over only the
        # attempts its own journal claimed (an agent_id cloned onto another Mac has another one).
        self._db.execute(
            "INSERT OR IGNORE INTO meta (name, value) VALUES ('journal_id', ?)", (uuid.uuid4().hex,)
        )
        self.journal_id: str = self._meta("journal_id") or ""

    def _meta(self, name: str) -> str | None:
        row = self._db.execute("SELECT value FROM meta WHERE name=?", (name,)).fetchone()
        return str(row["value"]) if row else None

    def remember(self, name: str, value: str) -> None:
        """A fact about this agent's past runs (the stack it last ran against, for doctor)."""
        with self._lock:
            self._db.execute(
                "INSERT INTO meta (name, value) VALUES (?, ?) ON CONFLICT(name) DO UPDATE SET "
                "value=excluded.value",
                (name, value),
            )

    def recall(self, name: str) -> str | None:
        with self._lock:
            return self._meta(name)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # ------------------------------------------------------------------ operations
    def begin(self, op: Operation) -> None:
        """Record that this agent is about to run `op.attempt` of the operation. Written before
        the command starts, so a crash leaves an in-flight entry to reconcile on restart."""
        with self._lock:
            self._db.execute(
                "INSERT INTO operations (operation_id, job_id, stage, stage_index, attempt, resource_key, "
                "precondition_version, outcome, receipt, updated_at, claim_secret, shard) VALUES "
                "(?,?,?,?,?,?,?,?,?,?,?,?) "
                "ON CONFLICT(operation_id) DO UPDATE SET attempt=excluded.attempt, "
                "resource_key=excluded.resource_key, "
                "precondition_version=excluded.precondition_version, outcome=excluded.outcome, "
                "receipt=NULL, pgid=NULL, outputs=NULL, reconciled=NULL, "
                "updated_at=excluded.updated_at, claim_secret=excluded.claim_secret",
                (
                    op.operation_id,
                    op.job_id,
                    op.stage,
                    op.stage_index,
                    op.attempt,
                    op.resource_key,
                    op.precondition_version,
                    op.outcome.value,
                    None,
                    _now(),
                    op.claim_secret,
                    op.shard,
                ),
            )

    def set_process_group(self, operation_id: str, attempt: int, pgid: int | None) -> None:
        """The process group the attempt's command runs in (None once it is gone): what a
        restarted agent waits on before it says the attempt was interrupted."""
        with self._lock:
            self._db.execute(
                "UPDATE operations SET pgid=?, updated_at=? WHERE operation_id=? AND attempt=?",
                (pgid, _now(), operation_id, attempt),
            )

    def set_outputs(self, operation_id: str, attempt: int, outputs: dict[str, str]) -> None:
        """The attempt's values so far (all of them), before they are recorded anywhere else."""
        with self._lock:
            self._db.execute(
                "UPDATE operations SET outputs=?, updated_at=? WHERE operation_id=? AND attempt=?",
                (json.dumps(outputs), _now(), operation_id, attempt),
            )

    def set_reconciled(self, operation_id: str, attempt: int, decision: str) -> None:
        """What the attempt's reconcile decided (rerun, resume, ...), before it acts on it."""
        with self._lock:
            self._db.execute(
                "UPDATE operations SET reconciled=?, updated_at=? WHERE operation_id=? AND attempt=?",
                (decision, _now(), operation_id, attempt),
            )

    def set_precondition(self, operation_id: str, attempt: int, precondition_version: str) -> None:
        """The precondition once the workspace is the job's (checked out, handoffs restored)."""
        with self._lock:
            self._db.execute(
                "UPDATE operations SET precondition_version=?, updated_at=? WHERE operation_id=? AND "
                "attempt=?",
                (precondition_version, _now(), operation_id, attempt),
            )

    def record(
        self,
        operation_id: str,
        attempt: int,
        outcome: OperationOutcome,
        receipt: dict[str, Any] | None,
        report: dict[str, Any] | None,
    ) -> None:
        """The outcome and receipt, and (when there is something to tell Relevo) the outbox entry
        that reports it: one SQLite transaction, so neither exists without the other."""
        with self._lock, self._transaction():
            self._db.execute(
                "UPDATE operations SET outcome=?, receipt=?, updated_at=? WHERE operation_id=? AND attempt=?",
                (
                    outcome.value,
                    json.dumps(receipt) if receipt is not None else None,
                    _now(),
                    operation_id,
                    attempt,
                ),
            )
            if report is not None:
                self._db.execute(
                    "INSERT INTO outbox (operation_id, attempt, payload, created_at) VALUES (?,?,?,?)",
                    (operation_id, attempt, json.dumps(report), _now()),
                )

    def get(self, operation_id: str) -> Operation | None:
        with self._lock:
            row = self._db.execute(
                "SELECT * FROM operations WHERE operation_id=?", (operation_id,)
            ).fetchone()
        return _operation(row) if row else None

    def in_flight(self) -> list[Operation]:
        """Operations whose command was running when the agent last stopped."""
        with self._lock:
            rows = self._db.execute(
                "SELECT * FROM operations WHERE outcome=? ORDER BY updated_at",
                (OperationOutcome.RUNNING.value,),
            ).fetchall()
        return [_operation(row) for row in rows]

    # ------------------------------------------------------------------ outbox
    def pending(self, limit: int = 50) -> list[Report]:
        with self._lock:
            rows = self._db.execute("SELECT * FROM outbox ORDER BY id LIMIT ?", (limit,)).fetchall()
        return [
            Report(row["id"], row["operation_id"], row["attempt"], json.loads(row["payload"]), row["tries"])
            for row in rows
        ]

    def sent(self, report_id: int) -> None:
        """Relevo has the report (or refused it for good): it leaves the outbox."""
        with self._lock:
            self._db.execute("DELETE FROM outbox WHERE id=?", (report_id,))

    def failed_to_send(self, report_id: int) -> None:
        with self._lock:
            self._db.execute("UPDATE outbox SET tries = tries + 1 WHERE id=?", (report_id,))

    def _transaction(self) -> _Transaction:
        return _Transaction(self._db)


class _Transaction:
    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, kind: object, *_: object) -> None:
        self._db.execute("ROLLBACK" if kind else "COMMIT")


def _operation(row: sqlite3.Row) -> Operation:
    return Operation(
        operation_id=row["operation_id"],
        job_id=row["job_id"],
        stage=row["stage"],
        stage_index=row["stage_index"],
        attempt=row["attempt"],
        resource_key=row["resource_key"],
        precondition_version=row["precondition_version"],
        outcome=OperationOutcome(row["outcome"]),
        receipt=json.loads(row["receipt"]) if row["receipt"] else None,
        updated_at=row["updated_at"],
        pgid=row["pgid"],
        outputs=json.loads(row["outputs"]) if row["outputs"] else None,
        claim_secret=row["claim_secret"],
        shard=row["shard"],
        reconciled=row["reconciled"],
    )


def last_stack(path: Path) -> dict[str, Any] | None:
    """The stack the agent last ran against (its endpoint, table and queue), read without
    creating or changing the journal (relevo-agent doctor); None when there is no record."""
    if not path.is_file():
        return None
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            row = db.execute("SELECT value FROM meta WHERE name = 'stack'").fetchone()
        finally:
            db.close()
    except sqlite3.Error:
        return None
    return json.loads(row[0]) if row else None
