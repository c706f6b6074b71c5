"""A job's transitions, read off the job record's change (the stream's OLD and NEW images).

Every status change of the job record is one transition; its `key` names it so that a repeat of
the same stream record, or of the same gate, is recognised: a gate is `waiting#<stage>`, the
job's end is `ended` (a job ends once), anything else is the status and the moment it was
written (a job runs again after its gate: `running#<updated_at>` twice, two transitions).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from relevo_core.execution import execution_arn
from relevo_core.models.status import JobStatus, StageStatus
from relevo_core.store.codec import envelope_of, from_attributes
from relevo_core.store.keys import JOB_SK, MACHINE_ATTRIBUTE, RUN_MACHINE

REJECTED = "Relevo.Approval.Rejected"
APPROVAL_TIMEOUT = "Relevo.Approval.Timeout"


@dataclass(frozen=True)
class JobTransition:
    job_id: str
    project: str
    status: JobStatus
    previous: JobStatus | None
    key: str
    ref: str
    commit: str | None
    trigger_source: str
    actor: str | None
    stage: str | None  # the gated stage while waiting, the last good stage at the end
    error_name: str | None
    held_reason: str | None
    # The approval gate the job was at before this transition (left it: approved, rejected, timed out).
    gate: str | None = None
    error_cause: str | None = None
    # When the job record's write that made this transition happened (its `updated_at`, epoch
    # seconds): what orders two reports of one job (store.latest_reports).
    at: float | None = None
    # At a success: the stages that ended `warning` (the job record's stage_outcomes).
    warning_stages: tuple[str, ...] = ()
    # At the job's end: each reconciliation of its stages in words (jobs.reconciliations), read
    # off its stage records by the reporter (with_stage_records).
    reconciled: tuple[str, ...] = ()
    # `commit` came from the job's first checkout, not its trigger (with_stage_records).
    commit_resolved: bool = False
    # The job's build number (RELEVO_BUILD_NUMBER), once it has one.
    build_number: int | None = None
    # The stages with a built-in release effect and its kind, in plan order (the envelope's plan).
    effect_kinds: tuple[tuple[str, str], ...] = ()
    # At the job's end: each such stage and its effect in words ("uploaded build 42 (VALID)"),
    # read off its stage record by the reporter (with_stage_records; models.effect_summary).
    released: tuple[tuple[str, str], ...] = ()
    # At the job's end: its tests counted across its stages and shards (their records' `tests`
    # summaries, with_stage_records): passed (flaky ones included), failed (errors included),
    # flaky, skipped, total. None: no stage read any reports.
    tests: tuple[int, int, int, int, int] | None = None
    # At the job's end, when tests failed: the first failed tests' ids (the reporter reads them
    # from the results documents: relevo_core.jobs.results_listing.job_failures).
    failed_tests: tuple[str, ...] = ()
    # Its execution runs the queued machine (JobQueuedStateMachine: the job waited, or could have
    # waited, for its project), not the common one (store/keys.MACHINE_ATTRIBUTE).
    queued_machine: bool = False

    @property
    def ended_at_gate(self) -> bool:
        """Ended by the gate's reject or timeout: notified as the gate's outcome, not as a failure."""
        return self.error_name in {REJECTED, APPROVAL_TIMEOUT}

    def as_event(self) -> dict[str, Any]:
        """The transition as it is dead-lettered and shown (no secrets: none are on the record)."""
        return {
            "job_id": self.job_id,
            "project": self.project,
            "status": self.status.value,
            "previous": self.previous.value if self.previous else None,
            "transition": self.key,
            "ref": self.ref,
            "commit": self.commit,
            "stage": self.stage,
            "error_name": self.error_name,
            # The rest of the transition, so that a dead-lettered report can be replayed.
            "error_cause": self.error_cause,
            "trigger_source": self.trigger_source,
            "actor": self.actor,
            "held_reason": self.held_reason,
            "gate": self.gate,
            "at": self.at,
            "warning_stages": list(self.warning_stages),
            "reconciled": list(self.reconciled),
            "commit_resolved": self.commit_resolved,
            "build_number": self.build_number,
            "effect_kinds": [list(pair) for pair in self.effect_kinds],
            "released": [list(pair) for pair in self.released],
            "tests": list(self.tests) if self.tests is not None else None,
            "failed_tests": list(self.failed_tests),
            "queued_machine": self.queued_machine,
        }


def _number(value: Any) -> int | None:
    """A build number as the record or the event holds it (a Decimal from the table)."""
    return None if value is None else int(value)


def transition_from_event(event: dict[str, Any]) -> JobTransition | None:
    """The transition a dead-lettered report's `event` (as_event) stands for; None when it is not one."""
    status = _status(event.get("status"))
    if status is None or not event.get("job_id") or not event.get("transition"):
        return None
    at = event.get("at")
    return JobTransition(
        job_id=str(event["job_id"]),
        project=str(event.get("project", "")),
        status=status,
        previous=_status(event.get("previous")),
        key=str(event["transition"]),
        ref=str(event.get("ref") or ""),
        commit=event.get("commit"),
        trigger_source=str(event.get("trigger_source") or ""),
        actor=event.get("actor"),
        stage=event.get("stage"),
        error_name=event.get("error_name"),
        held_reason=event.get("held_reason"),
        gate=event.get("gate"),
        error_cause=event.get("error_cause"),
        at=float(at) if isinstance(at, (int, float)) else None,
        warning_stages=tuple(str(name) for name in event.get("warning_stages") or ()),
        reconciled=tuple(str(line) for line in event.get("reconciled") or ()),
        commit_resolved=bool(event.get("commit_resolved")),
        build_number=_number(event.get("build_number")),
        effect_kinds=_pairs(event.get("effect_kinds")),
        released=_pairs(event.get("released")),
        tests=_counts(event.get("tests")),
        failed_tests=tuple(str(name) for name in event.get("failed_tests") or ()),
        queued_machine=bool(event.get("queued_machine")),
    )


def _counts(value: Any) -> tuple[int, int, int, int, int] | None:
    """A transition's test counts as an event holds them (a list of five numbers), else None."""
    if not isinstance(value, list) or len(value) != 5:
        return None
    if not all(isinstance(count, int) and not isinstance(count, bool) for count in value):
        return None
    passed, failed, flaky, skipped, total = value
    return passed, failed, flaky, skipped, total


def counts_of_tests(records: list[dict[str, Any]]) -> tuple[int, int, int, int, int] | None:
    """(passed, failed, flaky, skipped, total) of a job's stage and shard records' `tests`
    summaries (relevo_core.models.test_results.ResultsSummary, the last attempt's each); None when
    none has one. A summary that is not one is left out (an agent wrote it)."""
    from pydantic import ValidationError

    from relevo_core.models.test_results import ResultsSummary

    summaries = []
    for record in records:
        if isinstance(record.get("tests"), dict):
            try:
                summaries.append(ResultsSummary.model_validate(record["tests"]))
            except ValidationError:
                continue
    if not summaries:
        return None
    return (
        sum(summary.passed for summary in summaries),
        sum(summary.failed + summary.error for summary in summaries),
        sum(summary.flaky for summary in summaries),
        sum(summary.skipped for summary in summaries),
        sum(summary.total for summary in summaries),
    )


def tests_words(counts: tuple[int, int, int, int, int]) -> str:
    """`5 passed (1 flaky), 1 failed, 1 skipped` (a count of 0 is left out, passed always said)."""
    passed, failed, flaky, skipped, _total = counts
    words = [f"{passed} passed" + (f" ({flaky} flaky)" if flaky else "")]
    words += [f"{count} {name}" for count, name in ((failed, "failed"), (skipped, "skipped")) if count]
    return ", ".join(words)


def _pairs(value: Any) -> tuple[tuple[str, str], ...]:
    """(stage, text) pairs as an event holds them (lists of two strings); anything else is left out."""
    return tuple(
        (str(pair[0]), str(pair[1]))
        for pair in (value if isinstance(value, list) else [])
        if isinstance(pair, (list, tuple)) and len(pair) == 2
    )


def effect_kinds(envelope: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    """(stage, kind) of each stage of the envelope's plan that declares a built-in effect."""
    stages = envelope.get("stages")
    return tuple(
        (str(stage.get("name")), str(stage["effect"]["kind"]))
        for stage in (stages if isinstance(stages, list) else [])
        if isinstance(stage, dict) and isinstance(stage.get("effect"), dict) and stage["effect"].get("kind")
    )


def warning_stages(stage_outcomes: Any) -> tuple[str, ...]:
    """The stages a job record's `stage_outcomes` (the state machine's JSON of every stage's
    answer, written at the job's success) says ended `warning`."""
    import json

    try:
        outcomes = json.loads(stage_outcomes) if isinstance(stage_outcomes, str) else []
    except ValueError:
        return ()
    return tuple(
        str(o.get("stage"))
        for o in outcomes
        if isinstance(o, dict) and o.get("status") == StageStatus.WARNING.value and o.get("stage")
    )


def written_at(value: Any) -> float | None:
    """A record's `updated_at` (ISO 8601, as the state machine or the core wrote it) as epoch seconds."""
    if not isinstance(value, str) or not value:
        return None
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def stream_images(record: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """A stream record's OLD and NEW images as plain values (DynamoDB JSON decoded)."""
    change = record.get("dynamodb") or {}
    old, new = change.get("OldImage"), change.get("NewImage")
    return (from_attributes(old) if old else None), (from_attributes(new) if new else None)


# The changes of a stage record the reporter reports (a check run's summary per stage): the stage
# starting, or ending. Its stream function also receives the stage changes the metrics read
# (template.yaml: one function reads the stream for both), and keeps only these.
_STARTED_FROM = {StageStatus.PENDING.value, StageStatus.DISPATCHED.value}
_ENDED_FROM = _STARTED_FROM | {
    StageStatus.RUNNING.value,
    StageStatus.UNKNOWN.value,
    StageStatus.RECONCILED.value,
}
_ENDED_AS = {status.value for status in StageStatus if status.terminal} | {StageStatus.MANUAL_REVIEW.value}


def reported_stage_change(old: dict[str, Any] | None, new: dict[str, Any] | None) -> bool:
    """Whether a stage record's change is one the reporter reports: its start (from pending or
    dispatched to running) or its end (from a live status to an ended one, or to manual review)."""
    before, after = (old or {}).get("status"), (new or {}).get("status")
    if after == StageStatus.RUNNING.value:
        return before in _STARTED_FROM
    return after in _ENDED_AS and before in _ENDED_FROM


def _status(value: Any) -> JobStatus | None:
    try:
        return JobStatus(value)
    except ValueError:
        return None


def job_transition(old: dict[str, Any] | None, new: dict[str, Any] | None) -> JobTransition | None:
    """The transition one change of the table stands for; None for anything else."""
    if not new or new.get("sk") != JOB_SK:
        return None
    status = _status(new.get("status"))
    previous = _status((old or {}).get("status"))
    if status is None or status == previous:
        return None
    envelope = envelope_of(new)
    trigger = envelope.get("trigger") or {}
    if status is JobStatus.WAITING:
        key = f"waiting#{new.get('waiting_stage')}"
    elif status.terminal:
        key = "ended"
    else:
        key = f"{status.value}#{new.get('updated_at')}"
    stage = new.get("waiting_stage") if status is JobStatus.WAITING else new.get("last_successful_stage")
    return JobTransition(
        job_id=str(new.get("job_id")),
        project=str(new.get("project")),
        status=status,
        previous=previous,
        key=key,
        ref=str(envelope.get("ref", "")),
        commit=envelope.get("commit"),
        trigger_source=str(trigger.get("source", "")),
        actor=trigger.get("actor"),
        stage=stage or (old or {}).get("waiting_stage"),
        error_name=new.get("error_name"),
        held_reason=new.get("held_reason"),
        gate=(old or {}).get("waiting_stage") if previous is JobStatus.WAITING else None,
        error_cause=new.get("error_cause"),
        at=written_at(new.get("updated_at")),
        warning_stages=warning_stages(new.get("stage_outcomes")),
        build_number=_number(new.get("build_number")),
        effect_kinds=effect_kinds(envelope),
        queued_machine=new.get(MACHINE_ATTRIBUTE) != RUN_MACHINE,
    )


def with_stage_records(
    transition: JobTransition, stages: list[dict[str, Any]], shards: list[dict[str, Any]]
) -> JobTransition:
    """The transition with what the job's stage records add (store.job_stages): the commit its
    first checkout resolved, for a run whose trigger named none (the job view's JobContext.commit),
    and at its end each reconciliation of its stages and shards, in words."""
    from dataclasses import replace

    from relevo_core.jobs.reconciliations import reconciled_line

    records = sorted([*stages, *shards], key=lambda record: str(record.get("sk", "")))
    update: dict[str, Any] = {}
    if not transition.commit:
        resolved = next((str(r["checkout_commit"]) for r in records if r.get("checkout_commit")), None)
        if resolved:
            update.update(commit=resolved, commit_resolved=True)
    if transition.status.terminal:
        lines = []
        for record in records:
            name = str(record.get("stage_name") or "?")
            if record.get("shard_index") is not None:
                name = f"{name}[{record['shard_index']}]"
            for entry in record.get("reconciliations") or (
                [record["reconciled"]] if record.get("reconciled") else []
            ):
                line = reconciled_line(name, entry)
                if line:
                    lines.append(line)
        update["reconciled"] = tuple(lines)
        update["released"] = released(transition.effect_kinds, records)
        update["tests"] = counts_of_tests(records)
    return replace(transition, **update) if update else transition


def released(
    kinds: tuple[tuple[str, str], ...], records: list[dict[str, Any]]
) -> tuple[tuple[str, str], ...]:
    """Each stage with a built-in effect and the effect in words, from its stage record's values."""
    from relevo_core.models.effect_summary import effect_words, stage_values

    by_name = {
        str(record.get("stage_name")): record for record in records if record.get("shard_index") is None
    }
    return tuple(
        (stage, effect_words(kind, stage_values(by_name[stage]))) for stage, kind in kinds if stage in by_name
    )


def job_link(transition: JobTransition, machines: tuple[str, str], console_url: str | None) -> str:
    """Where a person opens the job: the project's console, else the execution in the Step
    Functions console (anyone with console access to the account can open it), on the machine
    that runs it (`machines`: the common one, the queued one)."""
    if console_url:
        return f"{console_url.rstrip('/')}/jobs/{transition.job_id}"
    state_machine_arn = machines[1] if transition.queued_machine else machines[0]
    region = state_machine_arn.split(":")[3]
    arn = execution_arn(state_machine_arn, transition.job_id)
    console = f"https://{region}.console.aws.amazon.com/states/home?region={region}"
    return f"{console}#/v2/executions/details/{quote(arn, safe=':')}"
