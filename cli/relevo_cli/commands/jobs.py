"""`relevo job …`: the listing (`list`), one job (`view`: its table, notes and log tail; `logs`,
`watch`) and what can be done to it (`approve`, `reject`, `cancel`, `rerun`, `resolve`,
`priority`, `delete`); and `project run`. main.py assembles them, with the older spellings
(`relevo job view`, `relevo job list`, `relevo project run`, …) as hidden aliases."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from enum import Enum
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from relevo_cli.cli_errors import JobId, ProjectId, UserMistake
from relevo_cli.commands.common import (
    JsonTriggerOption,
    StackOption,
    add_column,
    console,
    errors,
    print_trigger,
    quiet_option,
    stack_api,
)
from relevo_cli.words import (
    artifact_stage,
    error_sentence,
    format_duration,
    seconds_between,
    shard_name,
    time_ago,
)
from relevo_core.jobs.reconciliations import reconciled_line, reconciled_status
from relevo_core.models.status import queue_reason_words
from relevo_core.models.transfer import TransferProgress, human_bytes

job_app = typer.Typer(no_args_is_help=True, help="Jobs: list them, view one, follow its log, act on it.")


def gate_line(job_id: str, stage: str) -> str:
    """What a job waiting at its approval gate needs, and the command that gives it."""
    return f"waiting for approval before {stage}: `relevo job approve {job_id}` (or `relevo job reject {job_id} --reason …`)"


def render_job(job: dict, now: datetime | None = None) -> Table:
    """A row per stage; a stage with shards has a row per shard under it (its label: its index or
    its matrix combination), each with the Mac that ran it, its attempt, duration and result."""
    now = now or datetime.now(UTC)
    # The title stays short (rich wraps it to the table's width): why it waits is a note below.
    table = Table(title=f"{job['job_id']}  {job['project']}  [bold]{job['status']}[/bold]")
    for column in ("#", "stage", "status", "attempt", "agent", "duration", "exit", "error", "transfer"):
        add_column(table, column)
    for stage in job["stages"]:
        table.add_row(
            str(stage["index"]),
            escape(stage["name"]),
            *_attempt_cells(stage, now),
            transfer_text(stage.get("transfer")),
        )
        shards = stage.get("shards") or []
        for place, shard in enumerate(shards):
            branch = "└" if place == len(shards) - 1 else "├"
            table.add_row("", f"{branch} {escape(shard['label'])}", *_attempt_cells(shard, now), "")
    return table


def _attempt_cells(run: dict, now: datetime) -> list[str]:
    """status, attempt, agent, duration, exit, error of a stage's or a shard's shown attempt."""
    seconds = seconds_between(run.get("started_at"), run.get("ended_at"), now)
    return [
        # `reconciled`: the attempt found the earlier one's effect done and did not run (its note says how).
        reconciled_status(run),
        str(run["attempt"] or ""),
        run["agent_id"] or "",
        "" if seconds is None else format_duration(seconds),
        "" if run["exit_code"] in (None, -1) else str(run["exit_code"]),
        run["error_class"] or "",
    ]


def transfer_text(transfer: dict | None) -> str:
    """What the attempt's artifact upload says: under way (files, bytes, percent) or its totals."""
    return TransferProgress.model_validate(transfer).describe() if transfer else ""


def job_notes(job: dict) -> list[str]:
    """Lines under a job's table (printed whole, never wrapped to the table's width): where it
    builds and stands, then its approval gate (waiting at it, or how it was answered). Only what
    is known: no "@" without a commit, no last successful stage before one succeeded."""
    ref = f"ref {job['ref']}" + (f" @ {job['commit'][:12]}" if job.get("commit") else "")
    parts = [ref, f"region {job['region_affinity']}"]
    if job.get("last_successful_stage"):
        parts.append(f"last successful stage: {job['last_successful_stage']}")
    if job.get("last_writer"):
        parts.append(f"last writer: {job['last_writer']}")
    notes = [" · ".join(parts)]
    failure = error_sentence(job)
    if failure:
        notes.append(failure)
    if job.get("queue_reason"):
        notes.append(
            f"waiting ({job['queue_reason']}): {queue_reason_words(job['queue_reason'], job.get('region_affinity'), job.get('queue_detail'))}"
        )
    for shard in job.get("waiting_shards") or []:
        why = (
            f"waiting ({shard['queue_reason']}): {queue_reason_words(shard['queue_reason'], job.get('region_affinity'), shard.get('queue_detail'))}"
            if shard.get("queue_reason")
            else "about to be claimed"
        )
        notes.append(f"{shard['stage']} shard {shard['shard']} (attempt {shard['attempt']}) {why}")
    if job.get("held_reason"):
        notes.append(f"held ({job['held_reason']}): `relevo job release {job['job_id']}` starts it")
    if job.get("warning_stages"):
        warned = ", ".join(job["warning_stages"])
        notes.append(
            f"succeeded with warnings in {warned}"
            if job["status"] == "succeeded"
            else f"warnings so far in {warned}"
        )
        notes += [
            f"{stage['name']} warning: {stage['warning']}" for stage in job["stages"] if stage.get("warning")
        ]
    notes += reconciled_notes(job)
    if job.get("waiting_stage"):
        notes.append(gate_line(job["job_id"], job["waiting_stage"]))
    decision = job.get("approval_decision")
    if decision:
        reason = f": {decision['reason']}" if decision.get("reason") else ""
        notes.append(f"{decision['decision']} by {decision['actor']} before {decision['stage']}{reason}")
    for artifact in job.get("artifacts") or []:
        if artifact.get("removed_at"):
            notes.append(
                f"artifact {artifact_stage(artifact)}/{artifact['name']} ({artifact['size']} bytes) "
                f"removed by quota at {artifact['removed_at']} ({artifact['removed_reason']})"
            )
    # The table shows the transfer of each stage's current attempt; earlier attempts' go here.
    for stage in job["stages"]:
        for transfer in stage.get("transfers") or []:
            if transfer["attempt"] != stage.get("attempt"):
                notes.append(f"{stage['name']} attempt {transfer['attempt']}: {transfer_text(transfer)}")
    notes += handoff_notes(job)
    return notes


def reconciled_notes(job: dict) -> list[str]:
    """Each stage (or shard) whose attempt reconciled an earlier one's unknown outcome: what the
    probe found and what was done (`upload#2 reconciled on mac-t1: the effect of attempt 1 exists
    (probe exit 0); not run again`), every reconciliation of the stage, oldest first."""
    notes = []
    for stage in job["stages"]:
        entries = stage.get("reconciliations") or ([stage["reconciled"]] if stage.get("reconciled") else [])
        notes += [line for line in (reconciled_line(stage["name"], entry) for entry in entries) if line]
        for shard in stage.get("shards") or []:
            line = reconciled_line(shard_name(stage["name"], shard), shard.get("reconciled"))
            if line:
                notes.append(line)
    return notes


def handoff_notes(job: dict) -> list[str]:
    """What travelled between the stages (docs/handoff.md): each stage's files handed on, what its
    Mac restored, and its values."""
    notes = []
    for stage in job["stages"]:
        handoff = stage.get("handoff") or {}
        if handoff.get("digest"):
            notes.append(
                f"{stage['name']} handed on {handoff['files']} files, {handoff['symlinks']} symlinks, {human_bytes(handoff['bytes'])} "
                f"(tree {handoff['digest'][:12]})"
            )
        if handoff.get("restored"):
            restored = handoff["restored"]
            notes.append(
                f"{stage['name']} restored {handoff['restored_files']} files from {', '.join(restored['from_stages'])} on "
                f"{stage.get('agent_id') or 'its Mac'}: {human_bytes(handoff['restored_bytes'])} downloaded "
                f"(tree {str(handoff.get('restored_digest'))[:12]})"
            )
        for key, value in sorted((stage.get("outputs") or {}).items()):
            shown = value if len(value) <= 80 and "\n" not in value else value.splitlines()[0][:80] + " …"
            notes.append(f"{stage['name']} output {key}={shown}")
    return notes


STATUS_LOG_LINES = 20


def _print_log_tail(job: dict) -> None:
    """The last lines of the job's log under its table (the API sends up to 200: --json has them)."""
    tail = job.get("log_tail") or {"lines": []}
    lines = tail["lines"][-STATUS_LOG_LINES:]
    if not lines:
        return
    console.print(f"── last {len(lines)} log lines ──", markup=False, highlight=False, soft_wrap=True)
    labels = {
        (stage["name"], shard["shard"]): shard["label"]
        for stage in job["stages"]
        for shard in stage.get("shards") or []
    }
    for line in lines:
        # A shard's line is labelled with its shard: `test[device=iPhone 16, os=18.2]#1 | …`.
        where = (
            line["stage"]
            if line.get("shard") is None
            else f"{line['stage']}[{labels.get((line['stage'], line['shard']), line['shard'])}]"
        )
        console.print(
            f"{where}#{line['attempt']} | {line['text']}", markup=False, highlight=False, soft_wrap=True
        )
    console.print(
        f"(all of it: relevo job logs {job['job_id']}; follow: relevo job logs {job['job_id']} -f --from-seq {tail['next_seq']})",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )


def status(
    job_id: str = JobId,
    as_json: bool = typer.Option(False, "--json", help="print the job as JSON"),
    stack_file: Path | None = StackOption,
) -> None:
    """Show a job: its stages (where each ran, how it ended), its notes and the end of its log."""
    with stack_api(stack_file) as api:
        job = api.get_job(job_id)
    if as_json:
        sys.stdout.write(json.dumps(job, indent=2) + "\n")
    else:
        console.print(render_job(job))
        for note in job_notes(job):
            console.print(note, markup=False, highlight=False, soft_wrap=True)
        _print_log_tail(job)


def jobs(
    project: str | None = typer.Option(None, "--project", help="only this project's jobs"),
    status: str | None = typer.Option(
        None, "--status", help="queued, running, failed, ... (queued: in run order)"
    ),
    trigger: str | None = typer.Option(None, "--trigger", help="webhook, api, manual, schedule or retry"),
    agent: str | None = typer.Option(None, "--agent", help="jobs any attempt of which ran on this agent"),
    region: str | None = typer.Option(None, "--region", help="region affinity"),
    since: str | None = typer.Option(None, "--since", help="created at or after (ISO 8601)"),
    until: str | None = typer.Option(None, "--until", help="created at or before (ISO 8601)"),
    limit: int = typer.Option(50, "--limit", min=1, max=500),
    as_json: bool = typer.Option(False, "--json", help="print the listing as JSON"),
    stack_file: Path | None = StackOption,
) -> None:
    """List jobs, newest first; with --status queued, in the order they will run."""
    with stack_api(stack_file) as api:
        listing = api.list_jobs(
            project=project,
            status=status,
            trigger=trigger,
            agent=agent,
            region=region,
            since=since,
            until=until,
            limit=limit,
        )
    if as_json:
        sys.stdout.write(json.dumps(listing, indent=2) + "\n")
        return
    queued = status == "queued"
    now = datetime.now(UTC)
    table = Table(title=f"{listing['count']} job(s){' (more not shown)' if listing['truncated'] else ''}")
    if queued:
        table.add_column("#", justify="right")
    for column in (
        "job",
        "project",
        "status",
        "progress",
        "trigger",
        "ref",
        "region",
        "priority",
        "created",
        "why waiting" if queued else "last good stage",
    ):
        add_column(table, column)
    for job in listing["jobs"]:
        row = [] if not queued else [str(job["queue_position"])]
        status_cell = f"{job['status']} ({job['held_reason']})" if job.get("held_reason") else job["status"]
        # The commit it builds: the trigger's, or the one its first checkout resolved the ref to.
        ref_cell = (job["ref"] or "") + (f" @ {job['commit'][:8]}" if job.get("commit") else "")
        row += [
            job["job_id"],
            job["project"],
            status_cell,
            progress_text(job),
            job["trigger"] or "",
            ref_cell,
            job["region_affinity"] or "",
            str(job["priority"]),
            time_ago(job["created_at"], now),
            (job["queue_reason"] or "") if queued else (job["last_successful_stage"] or ""),
        ]
        table.add_row(*row)
    console.print(table)


def progress_text(job: dict) -> str:
    """`3/6`: the stage runs done of the job's runs (a stage with shards counts one run a shard)."""
    if job.get("runs_total") is None:
        return ""
    return f"{job.get('runs_done') or 0}/{job['runs_total']}"


def run(
    project_id: str = ProjectId,
    ref: str | None = typer.Option(None, help="ref to build (default: the project's default_ref)"),
    commit: str | None = typer.Option(None, help="commit to build"),
    stage: list[str] | None = typer.Option(None, "--stage", help="run only these stages (repeatable)"),
    priority: int | None = typer.Option(None, help="priority (manual runs default to 10)"),
    again: bool = typer.Option(False, "--again", help="a new run even if the same one is already queued"),
    quiet: bool = quiet_option("JOB=$(relevo project run P -q)"),
    as_json: bool = JsonTriggerOption,
    stack_file: Path | None = StackOption,
) -> None:
    """Run a project now (trigger: manual). Exit 0: a new job; 3: the same run is already a job (its id is printed, and what it is: queued, running or ended; --again runs it anew)."""
    import secrets

    body = {"trigger": "manual", "ref": ref, "commit": commit, "stages": stage or None, "priority": priority}
    if again:
        body["request_id"] = secrets.token_hex(8)
    with stack_api(stack_file) as api:
        result = api.run_project(project_id, {k: v for k, v in body.items() if v is not None})
        print_trigger(result, api, f"relevo project run {project_id} --again", quiet=quiet, as_json=as_json)


def rerun(
    job_id: str = JobId,
    from_stage: str | None = typer.Option(None, "--from-stage", help="skip the stages before this one"),
    quiet: bool = quiet_option("NEW=$(relevo job rerun JOB -q)"),
    as_json: bool = JsonTriggerOption,
    stack_file: Path | None = StackOption,
) -> None:
    """Run a job again with the project's current configuration (trigger: retry). Exit 0: a new job; 3: the same rerun is already a job (its id is printed)."""
    with stack_api(stack_file) as api:
        print_trigger(api.rerun_job(job_id, from_stage), api, quiet=quiet, as_json=as_json)


def approve(
    job_id: str = JobId,
    reason: str | None = typer.Option(None, help="why"),
    stack_file: Path | None = StackOption,
) -> None:
    """Approve a job waiting at its approval gate."""
    with stack_api(stack_file) as api:
        result = api.approve(job_id, reason)
    console.print(f"job [bold]{job_id}[/bold] approved before {result['stage']}")


def reject(
    job_id: str = JobId,
    reason: str = typer.Option(..., help="why (kept in the audit trail)"),
    stack_file: Path | None = StackOption,
) -> None:
    """Reject a job waiting at its approval gate: it fails with the reason."""
    with stack_api(stack_file) as api:
        result = api.reject(job_id, reason)
    console.print(f"job [bold]{job_id}[/bold] rejected before {result['stage']}")


def cancel(job_id: str = JobId, stack_file: Path | None = StackOption) -> None:
    """Cancel a job wherever it is; a running stage's process group is killed by its agent."""
    with stack_api(stack_file) as api:
        result = api.cancel_job(job_id)
    console.print(f"job [bold]{result['job_id']}[/bold] canceled (was {result['was']})")


def stage_words(stage: dict) -> str:
    """A stage's state in a few words: `running on mac-1 (attempt 2)`, `dispatched again after
    Relevo.Transient.ExitCode on mac-2`, `skipped (done by job_…)`."""
    status = stage["status"]
    if status == "dispatched":
        failed = stage["attempts_log"][-1] if stage.get("attempts_log") else None
        return f"dispatched again after {failed['error']} on {failed['agent']}" if failed else "dispatched"
    if status == "skipped":
        return f"skipped (done by {stage['reused_from']})" if stage.get("reused_from") else "skipped"
    return (
        f"{status} on {stage['agent_id']} (attempt {stage['attempt']})" if stage.get("agent_id") else status
    )


WATCH_EXIT_CODES = {"succeeded": 0, "failed": 1, "canceled": 1}


def watch(
    job_id: str = JobId,
    interval: float = typer.Option(
        2.0, "--interval", "-i", min=0.5, help="seconds between two looks at the job"
    ),
    stack_file: Path | None = StackOption,
) -> None:
    """Follow a job's stages until it ends, a line each time one moves (like `gh run watch`); exit 0 if the job succeeded, 1 if it failed or was canceled."""
    import time

    said: dict[str, str] = {}
    with stack_api(stack_file) as api:
        while True:
            job = api.get_job(job_id)
            changes = {
                "job": f"job {job_id} {job['status']}"
                + (
                    f" (waiting: {queue_reason_words(job['queue_reason'], job.get('region_affinity'), job.get('queue_detail'))})"
                    if job.get("queue_reason")
                    else ""
                )
            }
            changes.update(
                {
                    stage["name"]: f"  {stage['name']} {stage_words(stage)}"
                    for stage in job["stages"]
                    if stage["status"] != "pending"
                }
            )
            # Each shard of a stage with shards moves on its own.
            changes.update(
                {
                    shard_name(
                        stage["name"], shard
                    ): f"    {shard_name(stage['name'], shard)} {stage_words(shard)}"
                    for stage in job["stages"]
                    for shard in stage.get("shards") or []
                    if shard["status"] != "pending"
                }
            )
            for key, line in changes.items():
                if said.get(key) != line:
                    said[key] = line
                    console.print(line, markup=False, highlight=False, soft_wrap=True)
            if job.get("waiting_stage") and said.get("gate") != job["waiting_stage"]:
                said["gate"] = job["waiting_stage"]
                console.print(
                    gate_line(job_id, job["waiting_stage"]), markup=False, highlight=False, soft_wrap=True
                )
            if job["status"] in WATCH_EXIT_CODES:
                raise typer.Exit(WATCH_EXIT_CODES[job["status"]])
            time.sleep(interval)


class ResolveAs(str, Enum):
    SUCCEEDED = "succeeded"
    RETRY = "retry"
    FAILED = "failed"


@job_app.command("resolve")
def job_resolve(
    job_id: str = JobId,
    stage: str = typer.Option(..., "--stage", help="the stage in manual review"),
    resolution: ResolveAs = typer.Option(
        ..., "--as", help="succeeded: keep the effect; retry: run the stage again; failed: fail the job"
    ),
    reason: str | None = typer.Option(None, help="why (kept in the audit trail; required with --as failed)"),
    shard: int | None = typer.Option(
        None, "--shard", min=0, help="the shard in manual review, for a stage with shards (0-based)"
    ),
    stack_file: Path | None = StackOption,
) -> None:
    """Finish a stage (or one shard of it) that reconciliation left in manual review."""
    with stack_api(stack_file) as api:
        result = api.resolve_stage(job_id, stage, resolution.value, reason, shard)
    shard_text = f" shard {result['shard']}" if result.get("shard") is not None else ""
    console.print(
        f"job [bold]{job_id}[/bold] stage {result['stage']}{shard_text} resolved as {result['resolution']}"
    )


@job_app.command("priority")
def job_priority(
    job_id: str = JobId,
    priority: int = typer.Argument(
        ..., help="higher runs first (a negative value goes after --, e.g. -- -5)"
    ),
    stack_file: Path | None = StackOption,
) -> None:
    """Set the priority of a queued job; it moves to its new place in line at once."""
    with stack_api(stack_file) as api:
        result = api.set_priority(job_id, priority)
    console.print(
        f"job [bold]{result['job_id']}[/bold] priority {result['previous_priority']} -> {result['priority']}"
    )


@job_app.command("delete")
def job_delete(
    job_id: str = JobId,
    yes: bool = typer.Option(False, "--yes", "-y", help="do not ask for confirmation"),
    stack_file: Path | None = StackOption,
) -> None:
    """Delete an ended job with its stage records, log chunks and artifact records (safe to repeat if it was interrupted). The artifact files themselves expire by the bucket's lifecycle rule."""
    if not yes:
        typer.confirm(f"delete job {job_id} with its logs and artifact records?", abort=True)
    with stack_api(stack_file) as api:
        result = api.delete_job(job_id)
    removed = result["removed"]
    console.print(
        f"job [bold]{result['job_id']}[/bold] ({result['status']}) deleted with {removed['stages']} stage record(s), "
        f"{removed['log_chunks']} log chunk(s) and {removed['artifacts']} artifact record(s)"
    )


def wait_words(job_id: str, reason: str, region: str | None, detail: str | None) -> str:
    """Why a job waits, in words, and what a person can do about it."""
    words = queue_reason_words(reason, region, detail)
    hint = {
        "agent_offline": f" (`relevo local agent --region {region}` starts one on this machine; `relevo agent list` shows the fleet)",
        "agent_paused": " (`relevo agent list` shows who paused them; `relevo agent resume AGENT` ends a pause)",
    }.get(reason, "")
    return f"job {job_id} waits: {words}{hint}"


def _combination(text: str) -> tuple[str, ...]:
    """A matrix label's key=value pairs, however it is spaced after its commas."""
    return tuple(part.strip() for part in text.split(","))


def chosen_shards(job_id: str, stages: list[dict], stage: list[str], chosen: list[str]) -> list[int]:
    """The shard indexes `--shard` names (an index, or a matrix combination as the job view labels
    it) among the shards of the one `--stage` given; a mistake names what there is instead."""
    if len(stage) != 1:
        raise UserMistake(
            f"--shard: name the stage whose shards you mean with one --stage (job {job_id}'s stages with shards: "
            f"{', '.join(s['name'] for s in stages if s.get('shards')) or 'none'})"
        )
    found = next(s for s in stages if s["name"] == stage[0])
    shards = found.get("shards") or []
    if not shards:
        raise UserMistake(
            f"--shard: stage {stage[0]!r} of job {job_id} has no shards (neither parallel nor matrix)"
        )
    indexes = []
    for wanted in chosen:
        match = next(
            (
                s["shard"]
                for s in shards
                if wanted.strip() == str(s["shard"]) or _combination(wanted) == _combination(s["label"])
            ),
            None,
        )
        if match is None:
            said = (
                f"0 to {len(shards) - 1}"
                if shards[0]["label"] == "0"
                else "; ".join(s["label"] for s in shards)
            )
            raise UserMistake(f"--shard {wanted!r}: stage {stage[0]!r} has no such shard; its shards: {said}")
        indexes.append(match)
    return indexes


def logs(
    job_id: str = JobId,
    follow: bool = typer.Option(
        False, "--follow", "-f", help="keep printing until the job ends; exit 0 if it succeeded, 1 if not"
    ),
    stage: list[str] | None = typer.Option(
        None, "--stage", "-s", help="only this stage's lines (repeatable)"
    ),
    shard: list[str] | None = typer.Option(
        None,
        "--shard",
        help="with one --stage that has shards: only this shard's lines, by index (RELEVO_SHARD_INDEX) or "
        "matrix combination as `relevo job view` labels it, e.g. 'device=iPhone 16, os=18.2' (repeatable)",
    ),
    from_seq: str = typer.Option(
        "0", "--from-seq", help="start at this cursor (job view's log_tail.next_seq: right after its tail)"
    ),
    poll_sec: float = typer.Option(0.5, "--poll", min=0.1, help="seconds between polls while following"),
    stack_file: Path | None = StackOption,
) -> None:
    """Print a job's output (already masked), each line labelled stage#attempt (a shard's stage[shard]#attempt, the shards of a stage interleaved), with a line where each stage begins and ends; with -f follow it until the job ends, across dropped connections."""
    from relevo_cli.follow import LogFollower, StageLog

    def write(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    def what_it_does(page: dict) -> None:
        # Said once each time it changes, after the lines stored before it: the gate it waits at,
        # or why no stage of it runs.
        if page.get("waiting_stage"):
            errors.print(
                gate_line(job_id, page["waiting_stage"]), markup=False, highlight=False, soft_wrap=True
            )
        elif page.get("queue_reason") and not page.get("terminal"):
            errors.print(
                wait_words(
                    job_id, page["queue_reason"], page.get("region_affinity"), page.get("queue_detail")
                ),
                markup=False,
                highlight=False,
                soft_wrap=True,
            )

    with stack_api(stack_file) as api:
        shards: list[int] | None = None
        if stage or shard:
            stages = api.get_job(job_id)["stages"]
            plan = [s["name"] for s in stages]
            unknown = [name for name in stage or [] if name not in plan]
            if unknown:
                raise UserMistake(
                    f"--stage {unknown[0]!r}: job {job_id} has no such stage; its stages: {', '.join(plan)}"
                )
            if shard:
                shards = chosen_shards(job_id, stages, stage or [], shard)
        follower = LogFollower(
            fetch=lambda seq: api.job_logs(job_id, from_seq=seq),
            write=write,
            warn=lambda message: errors.print(f"[yellow]{message}[/yellow]"),
            status_changed=what_it_does,
            poll_sec=poll_sec,
            next_seq=from_seq,
            render=StageLog(write, only=stage, shards=shards),
        )
        code = follower.run(follow)
    if follow:
        errors.print(f"job {job_id} {follower.status}")
    raise typer.Exit(code)
