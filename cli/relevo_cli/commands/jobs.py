"""`relevo job …`: the listing (`list`), one job (`view`: its table, notes and log tail; `logs`,
`watch`) and what can be done to it (`approve`, `reject`, `cancel`, `rerun`, `resolve`,
`priority`, `delete`); and `project run`. main.py assembles them, with the older spellings
(`relevo job view`, `relevo job list`, `relevo project run`, …) as hidden aliases."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from enum import Enum
from pathlib import Path

import typer
from rich.table import Table

from relevo_cli import job_view
from relevo_cli.cli_errors import JobId, ProjectId, UserMistake
from relevo_cli.commands.common import (
    JsonTriggerOption,
    StackOption,
    add_column,
    console,
    errors,
    print_trigger,
    quiet_option,
    show,
    stack_api,
)
from relevo_cli.job_view import gate_line
from relevo_cli.words import (
    shard_name,
    time_ago,
)
from relevo_core.models.status import queue_reason_words

job_app = typer.Typer(no_args_is_help=True, help="Jobs: list them, view one, follow its log, act on it.")


def status(
    job_id: str = JobId,
    as_json: bool = typer.Option(False, "--json", help="print the job as JSON"),
    stack_file: Path | None = StackOption,
) -> None:
    """Show a job: its stages (where each ran, how it ended), its notes and the end of its log."""
    show(stack_file, lambda api: api.get_job(job_id), as_json, job_view.view)


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
    query = {"project": project, "status": status, "trigger": trigger, "agent": agent, "region": region}
    show(
        stack_file,
        lambda api: api.list_jobs(**query, since=since, until=until, limit=limit),
        as_json,
        lambda listing: [_job_rows(listing, queued=status == "queued")],
    )


def _job_rows(listing: dict, queued: bool) -> Table:
    """The listing's table; of the queue (`queued`), in run order with why each waits."""
    now = datetime.now(UTC)
    table = Table(title=f"{listing['count']} job(s){' (more not shown)' if listing['truncated'] else ''}")
    if queued:
        table.add_column("#", justify="right")
    last = "why waiting" if queued else "last good stage"
    for column in (
        "job",
        "project",
        "status",
        "progress",
        "trigger",
        "ref",
        "build",
        "region",
        "priority",
        "created",
        last,
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
            # The job's build number (RELEVO_BUILD_NUMBER), once a stage that needs one was claimed.
            str(job["build_number"]) if job.get("build_number") is not None else "",
            job["region_affinity"] or "",
            str(job["priority"]),
            time_ago(job["created_at"], now),
            (job["queue_reason"] or "") if queued else (job["last_successful_stage"] or ""),
        ]
        table.add_row(*row)
    return table


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
    """Run a project now (trigger: manual). Exit 0: a new job; 3: the same run is already a job (its id is
    printed, and what it is: queued, running or ended; --again runs it anew)."""
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
    """Run a job again with the project's current configuration (trigger: retry). Exit 0: a new job; 3: the
    same rerun is already a job (its id is printed)."""
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
    """Follow a job's stages until it ends, a line each time one moves (like `gh run watch`); exit 0 if the
    job succeeded, 1 if it failed or was canceled."""
    import time

    said: dict[str, str] = {}
    with stack_api(stack_file) as api:
        while True:
            job = api.get_job(job_id)
            changes = {
                "job": f"job {job_id} {job['status']}"
                + (
                    " (waiting: "
                    + queue_reason_words(
                        job["queue_reason"], job.get("region_affinity"), job.get("queue_detail")
                    )
                    + ")"
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
    """Delete an ended job with its stage records, log chunks and artifact records (safe to repeat if it was
    interrupted). The artifact files themselves expire by the bucket's lifecycle rule."""
    if not yes:
        typer.confirm(f"delete job {job_id} with its logs and artifact records?", abort=True)
    with stack_api(stack_file) as api:
        result = api.delete_job(job_id)
    removed = result["removed"]
    console.print(
        f"job [bold]{result['job_id']}[/bold] ({result['status']}) deleted with {removed['stages']} stage "
        "record(s), "
        f"{removed['log_chunks']} log chunk(s) and {removed['artifacts']} artifact record(s)"
    )


def wait_words(job_id: str, reason: str, region: str | None, detail: str | None) -> str:
    """Why a job waits, in words, and what a person can do about it."""
    words = queue_reason_words(reason, region, detail)
    hint = {
        "agent_offline": f" (`relevo local agent --region {region}` starts one on this machine; `relevo "
        "agent list` shows the fleet)",
        "agent_paused": " (`relevo agent list` shows who paused them; `relevo agent resume AGENT` ends a "
        "pause)",
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
            f"--shard: name the stage whose shards you mean with one --stage (job {job_id}'s stages with "
            "shards: "
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
    """Print a job's output (already masked), each line labelled stage#attempt (a shard's
    stage[shard]#attempt, the shards of a stage interleaved), with a line where each stage begins and ends;
    with -f follow it until the job ends, across dropped connections."""
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
