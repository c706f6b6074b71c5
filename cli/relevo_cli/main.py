"""`relevo`: the operator CLI."""

from __future__ import annotations

import json
import sys
from datetime import datetime, timezone
from enum import Enum
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional

import typer
from rich.console import Console
from rich.table import Table

from relevo_cli.api import ApiError, RelevoApi
from relevo_cli.cli_errors import JobId, ProjectId, RelevoGroup, set_debug
from relevo_cli.deploy_commands import aws_app, stack_app
from relevo_cli.drill.command import drill_command
from relevo_cli.local_commands import local_app
from relevo_agent.stackfile import StackInfo, load_stack

app = typer.Typer(cls=RelevoGroup, no_args_is_help=True, help="Relevo: one job per trigger, relayed across your Macs.")
project_app = typer.Typer(no_args_is_help=True, help="The project registry.")
dlq_app = typer.Typer(no_args_is_help=True, help="The job dead-letter queue.")
job_app = typer.Typer(no_args_is_help=True, help="Operator actions on one job.")
app.add_typer(local_app, name="local")
app.add_typer(project_app, name="project")
app.add_typer(dlq_app, name="dlq")
app.add_typer(job_app, name="job")
app.add_typer(stack_app, name="stack")
app.add_typer(aws_app, name="aws")
console = Console()
errors = Console(stderr=True)

StackOption = typer.Option(None, "--stack-file", envvar="RELEVO_STACK_FILE", help="stack.json of the stack to use")


@app.callback()
def _root(
    ctx: typer.Context,
    debug: bool = typer.Option(False, "--debug", envvar="RELEVO_DEBUG", help="show the traceback of any error"),
) -> None:
    set_debug(ctx, debug)


def _stack(stack_file: Optional[Path]) -> StackInfo:
    try:
        stack = load_stack(stack_file)
    except FileNotFoundError as exc:
        errors.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from exc
    stack.apply_to_environment()
    return stack


def _fail(exc: ApiError) -> None:
    errors.print(f"[red]{exc}[/red]")
    raise typer.Exit(1)


@contextmanager
def _api(stack_file: Optional[Path]) -> Iterator[RelevoApi]:
    """The API of the stack, with a refusal printed as its code and message (exit 1)."""
    api = RelevoApi.for_stack(_stack(stack_file))
    try:
        yield api
    except ApiError as exc:
        _fail(exc)


def gate_line(job_id: str, stage: str) -> str:
    """What a job waiting at its approval gate needs, and the command that gives it."""
    return f"waiting for approval before {stage}: `relevo approve {job_id}` (or `relevo reject {job_id} --reason …`)"


def render_job(job: dict) -> Table:
    waiting = f" (waiting: {job['queue_reason']})" if job.get("queue_reason") else ""
    held = f" (held: {job['held_reason']}; relevo release starts it)" if job.get("held_reason") else ""
    table = Table(title=f"{job['job_id']}  {job['project']}  [bold]{job['status']}[/bold]{waiting}{held}")
    for column in ("#", "stage", "status", "attempt", "agent", "exit", "error"):
        table.add_column(column)
    for stage in job["stages"]:
        table.add_row(
            str(stage["index"]),
            stage["name"],
            stage["status"],
            str(stage["attempt"] or ""),
            stage["agent_id"] or "",
            "" if stage["exit_code"] in (None, -1) else str(stage["exit_code"]),
            stage["error_class"] or "",
        )
    return table


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
    if job.get("waiting_stage"):
        notes.append(gate_line(job["job_id"], job["waiting_stage"]))
    decision = job.get("approval_decision")
    if decision:
        reason = f": {decision['reason']}" if decision.get("reason") else ""
        notes.append(f"{decision['decision']} by {decision['actor']} before {decision['stage']}{reason}")
    return notes


STATUS_LOG_LINES = 20


def _print_log_tail(job: dict) -> None:
    """The last lines of the job's log under its table (the API sends up to 200: --json has them)."""
    tail = job.get("log_tail") or {"lines": []}
    lines = tail["lines"][-STATUS_LOG_LINES:]
    if not lines:
        return
    console.rule(f"last {len(lines)} log lines")
    for line in lines:
        console.print(f"{line['stage']}#{line['attempt']} | {line['text']}", markup=False, highlight=False, soft_wrap=True)
    console.print(f"(all of it: relevo logs {job['job_id']}; follow: relevo logs {job['job_id']} -f --from-seq {tail['next_seq']})", markup=False, highlight=False, soft_wrap=True)


@app.command("status")
def status(
    job_id: str = JobId,
    as_json: bool = typer.Option(False, "--json", help="print the job as JSON"),
    stack_file: Optional[Path] = StackOption,
) -> None:
    """Show a job and its stages."""
    with _api(stack_file) as api:
        job = api.get_job(job_id)
    if as_json:
        sys.stdout.write(json.dumps(job, indent=2) + "\n")
    else:
        console.print(render_job(job))
        for note in job_notes(job):
            console.print(note, markup=False, highlight=False, soft_wrap=True)
        _print_log_tail(job)


# `relevo job show JOB` is the same view, beside the other one-job commands.
job_app.command("show", help="Show a job and its stages (same as `relevo status`).")(status)


@app.command("jobs")
def jobs(
    project: Optional[str] = typer.Option(None, "--project", help="only this project's jobs"),
    status: Optional[str] = typer.Option(None, "--status", help="queued, running, failed, ... (queued: in run order)"),
    trigger: Optional[str] = typer.Option(None, "--trigger", help="webhook, api, manual, schedule or retry"),
    agent: Optional[str] = typer.Option(None, "--agent", help="jobs any attempt of which ran on this agent"),
    region: Optional[str] = typer.Option(None, "--region", help="region affinity"),
    since: Optional[str] = typer.Option(None, "--since", help="created at or after (ISO 8601)"),
    until: Optional[str] = typer.Option(None, "--until", help="created at or before (ISO 8601)"),
    limit: int = typer.Option(50, "--limit", min=1, max=500),
    as_json: bool = typer.Option(False, "--json", help="print the listing as JSON"),
    stack_file: Optional[Path] = StackOption,
) -> None:
    """List jobs, newest first; with --status queued, in the order they will run."""
    with _api(stack_file) as api:
        listing = api.list_jobs(
            project=project, status=status, trigger=trigger, agent=agent, region=region,
            since=since, until=until, limit=limit,
        )
    if as_json:
        sys.stdout.write(json.dumps(listing, indent=2) + "\n")
        return
    queued = status == "queued"
    table = Table(title=f"{listing['count']} job(s){' (more not shown)' if listing['truncated'] else ''}")
    if queued:
        table.add_column("#", justify="right")
    for column in ("job", "project", "status", "trigger", "ref", "region", "priority", "created", "why waiting" if queued else "last good stage"):
        table.add_column(column)
    for job in listing["jobs"]:
        row = [] if not queued else [str(job["queue_position"])]
        status_cell = f"{job['status']} ({job['held_reason']})" if job.get("held_reason") else job["status"]
        row += [job["job_id"], job["project"], status_cell, job["trigger"] or "", job["ref"] or "",
                job["region_affinity"] or "", str(job["priority"]), (job["created_at"] or "")[:19],
                (job["queue_reason"] or "") if queued else (job["last_successful_stage"] or "")]
        table.add_row(*row)
    console.print(table)


@project_app.command("apply")
def project_apply(file: Path, stack_file: Optional[Path] = StackOption) -> None:
    """Validate and store a project; webhook secrets go to Secrets Manager."""
    from relevo_cli.projects import apply_loaded, load_project_file

    loaded = load_project_file(file)  # the file's own mistakes first: they need no stack
    stack = _stack(stack_file)
    try:
        project = apply_loaded(stack, RelevoApi.for_stack(stack), loaded)
    except ApiError as exc:
        _fail(exc)
    console.print(f"project [bold]{project['id']}[/bold] applied ({len(project['stages'])} stages, region {project['region_affinity']})")


@project_app.command("schema")
def project_schema() -> None:
    """Print the project file's JSON Schema (editors validate and complete with it; see docs/project-file.md)."""
    from relevo_cli.reference import project_file_schema

    sys.stdout.write(json.dumps(project_file_schema(), indent=2) + "\n")


@project_app.command("show")
def project_show(project_id: str = ProjectId, stack_file: Optional[Path] = StackOption) -> None:
    """Print a project as stored."""
    with _api(stack_file) as api:
        sys.stdout.write(json.dumps(api.get_project(project_id), indent=2) + "\n")


@project_app.command("list")
def project_list(stack_file: Optional[Path] = StackOption) -> None:
    """List registered projects."""
    with _api(stack_file) as api:
        listing = api.list_projects()
    table = Table(title=f"{listing['count']} projects")
    for column in ("id", "repo", "region", "stages", "priority"):
        table.add_column(column)
    for project in listing["projects"]:
        table.add_row(
            project["id"], project["repo"], project["region_affinity"], " → ".join(s["name"] for s in project["stages"]), str(project["priority"])
        )
    console.print(table)


@project_app.command("grant")
def project_grant(
    project_id: str = ProjectId,
    principal: str = typer.Argument(..., help="IAM user or role ARN; a trailing /* matches a role's sessions"),
    level: str = typer.Argument(..., help="view, operate, manage, or none (revoke)"),
    stack_file: Optional[Path] = StackOption,
) -> None:
    """Give a principal a level on a project (needs manage)."""
    with _api(stack_file) as api:
        result = api.grant(project_id, principal, level)
    console.print(f"{result['principal']} → [bold]{result['level']}[/bold] on {project_id}")


@project_app.command("grants")
def project_grants(project_id: str = ProjectId, stack_file: Optional[Path] = StackOption) -> None:
    """Who may do what to a project (needs view)."""
    with _api(stack_file) as api:
        listing = api.grants(project_id)
    table = Table(title=f"{listing['count']} grants on {project_id}")
    for column in ("principal", "level", "granted by"):
        table.add_column(column)
    for grant in listing["grants"]:
        table.add_row(grant["principal"], grant["level"], "(AdminPrincipals)" if grant.get("admin") else grant.get("granted_by", ""))
    console.print(table)


# How a duplicate's existing job is named, by its status.
_ALREADY = {"queued": "already queued as", "held": "already held as", "succeeded": "already ran as",
            "failed": "already ran as", "canceled": "already ran as"}


def _print_trigger(result: dict, api: RelevoApi, again: str | None = None) -> None:
    """A new job, or the job a duplicate is: with its status (one more call), and for an ended
    one the command (`again`) that runs the same work anew."""
    if not result.get("duplicate"):
        console.print(f"job [bold]{result['job_id']}[/bold] {result.get('outcome', 'queued')}")
        return
    job_id = result["job_id"]
    status = api.get_job(job_id)["status"]
    line = f"{_ALREADY.get(status, 'already running as')} {job_id} ({status})"
    if again and _ALREADY.get(status) == "already ran as":
        line += f"; `{again}` runs it again"
    console.print(line, markup=False, highlight=False, soft_wrap=True)


@app.command("run")
def run(
    project_id: str = ProjectId,
    ref: Optional[str] = typer.Option(None, help="ref to build (default: the project's default_ref)"),
    commit: Optional[str] = typer.Option(None, help="commit to build"),
    stage: Optional[list[str]] = typer.Option(None, "--stage", help="run only these stages (repeatable)"),
    priority: Optional[int] = typer.Option(None, help="priority (manual runs default to 10)"),
    again: bool = typer.Option(False, "--again", help="a new run even if the same one is already queued"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="print only the job id (JOB=$(relevo run P -q))"),
    stack_file: Optional[Path] = StackOption,
) -> None:
    """Run a project now (trigger: manual)."""
    import secrets

    body = {"trigger": "manual", "ref": ref, "commit": commit, "stages": stage or None, "priority": priority}
    if again:
        body["request_id"] = secrets.token_hex(8)
    with _api(stack_file) as api:
        result = api.run_project(project_id, {k: v for k, v in body.items() if v is not None})
        if quiet:
            sys.stdout.write(result["job_id"] + "\n")
            return
        _print_trigger(result, api, f"relevo run {project_id} --again")


@app.command("rerun")
def rerun(
    job_id: str = JobId,
    from_stage: Optional[str] = typer.Option(None, "--from-stage", help="skip the stages before this one"),
    stack_file: Optional[Path] = StackOption,
) -> None:
    """Run a job again with the project's current configuration (trigger: retry)."""
    with _api(stack_file) as api:
        _print_trigger(api.rerun_job(job_id, from_stage), api)


@app.command("approve")
def approve(
    job_id: str = JobId, reason: Optional[str] = typer.Option(None, help="why"), stack_file: Optional[Path] = StackOption
) -> None:
    """Approve a job waiting at its approval gate."""
    with _api(stack_file) as api:
        result = api.approve(job_id, reason)
    console.print(f"job [bold]{job_id}[/bold] approved before {result['stage']}")


@app.command("reject")
def reject(job_id: str = JobId, reason: str = typer.Option(..., help="why (kept in the audit trail)"), stack_file: Optional[Path] = StackOption) -> None:
    """Reject a job waiting at its approval gate: it fails with the reason."""
    with _api(stack_file) as api:
        result = api.reject(job_id, reason)
    console.print(f"job [bold]{job_id}[/bold] rejected before {result['stage']}")


@app.command("cancel")
def cancel(job_id: str = JobId, stack_file: Optional[Path] = StackOption) -> None:
    """Cancel a job wherever it is; a running stage's process group is killed by its agent."""
    with _api(stack_file) as api:
        result = api.cancel_job(job_id)
    console.print(f"job [bold]{result['job_id']}[/bold] canceled (was {result['was']})")


class ResolveAs(str, Enum):
    SUCCEEDED = "succeeded"
    RETRY = "retry"
    FAILED = "failed"


@job_app.command("resolve")
def job_resolve(
    job_id: str = JobId,
    stage: str = typer.Option(..., "--stage", help="the stage in manual review"),
    resolution: ResolveAs = typer.Option(..., "--as", help="succeeded: keep the effect; retry: run the stage again; failed: fail the job"),
    reason: Optional[str] = typer.Option(None, help="why (kept in the audit trail; required with --as failed)"),
    stack_file: Optional[Path] = StackOption,
) -> None:
    """Finish a stage that reconciliation left in manual review."""
    with _api(stack_file) as api:
        result = api.resolve_stage(job_id, stage, resolution.value, reason)
    console.print(f"job [bold]{job_id}[/bold] stage {result['stage']} resolved as {result['resolution']}")


@dlq_app.command("list")
def dlq_list(stack_file: Optional[Path] = StackOption) -> None:
    """Jobs that failed for good, newest first."""
    with _api(stack_file) as api:
        listing = api.dead_letters()
    table = Table(title=f"{listing['count']} dead-lettered jobs")
    for column in ("job", "project", "failed stage", "error", "attempts", "last good stage", "state"):
        table.add_column(column)
    for entry in listing["entries"]:
        table.add_row(
            entry["job_id"], entry["project"], entry["failed_stage"] or "-", entry["error"],
            str(entry["attempts"] or "-"), entry["last_successful_stage"] or "-", entry["state"],
        )
    console.print(table)
    frozen = listing.get("frozen_keys") or []
    if frozen:
        keys = Table(title=f"{len(frozen)} frozen idempotency keys (automatic runs refused, no stage retries)")
        for column in ("idempotency key", "project", "frozen at", "entries"):
            keys.add_column(column)
        for record in frozen:
            keys.add_row(
                record["idempotency_key"], record["project"] or "-", record["frozen_at"] or "-",
                ", ".join(entry["job_id"] for entry in record["entries"]),
            )
        console.print(keys)
        console.print("lift a freeze with: relevo dlq unfreeze KEY")


@dlq_app.command("show")
def dlq_show(job_id: str = JobId, stack_file: Optional[Path] = StackOption) -> None:
    """One dead-lettered job, with everything needed to resume it."""
    with _api(stack_file) as api:
        sys.stdout.write(json.dumps(api.dead_letter(job_id), indent=2) + "\n")


@dlq_app.command("redrive")
def dlq_redrive(job_id: str = JobId, stack_file: Optional[Path] = StackOption) -> None:
    """Resume a dead-lettered job from its failed stage, under the same idempotency key."""
    with _api(stack_file) as api:
        _print_trigger(api.redrive(job_id), api)


@dlq_app.command("unfreeze")
def dlq_unfreeze(key: str, stack_file: Optional[Path] = StackOption) -> None:
    """Lift the freeze of an idempotency key: automatic runs and stage retries resume."""
    with _api(stack_file) as api:
        result = api.unfreeze_key(key)
    console.print(f"idempotency key [bold]{result['idempotency_key']}[/bold] unfrozen")


@app.command("release")
def release(job_id: str = JobId, stack_file: Optional[Path] = StackOption) -> None:
    """Release a held job (a pull request from a fork, or a repeat after its dedup window) into the queue."""
    with _api(stack_file) as api:
        _print_trigger(api.release_job(job_id), api)


@app.command("queue")
def queue(
    as_json: bool = typer.Option(False, "--json", help="print the queue as JSON"),
    stack_file: Optional[Path] = StackOption,
) -> None:
    """Jobs waiting to run, in order, with why each waits (the project's lock, or no free agent), and every agent's load."""
    with _api(stack_file) as api:
        view = api.queue()
    if as_json:
        sys.stdout.write(json.dumps(view, indent=2) + "\n")
        return
    waiting = view.get("waiting_for_agent", [])
    title = f"{view['count']} queued job(s){' (more not shown)' if view['truncated'] else ''}"
    jobs_table = Table(title=title + (f", {len(waiting)} running job(s) waiting for an agent" if waiting else ""))
    for column in ("#", "job", "project", "priority", "region", "trigger", "ref", "queued since", "why waiting"):
        jobs_table.add_column(column, justify="right" if column in ("#", "priority") else "left")
    # A dispatched stage is already past the project's lock: it goes to the first free agent.
    for job in waiting:
        why = f"{job['queue_reason'] or 'about to be claimed'}: stage {job['stage']} on the {job['region_affinity']} queue"
        jobs_table.add_row(
            "-", job["job_id"], job["project"], str(job["priority"]), job["region_affinity"] or "",
            job["trigger"] or "", job["ref"] or "", (job["dispatched_at"] or job["created_at"] or "")[:19], why,
        )
    for job in view["jobs"]:
        jobs_table.add_row(
            str(job["queue_position"]), job["job_id"], job["project"], str(job["priority"]), job["region_affinity"] or "",
            job["trigger"] or "", job["ref"] or "", (job["created_at"] or "")[:19], job["queue_reason"] or "",
        )
    console.print(jobs_table)
    agents_table = Table(title=f"{len(view['agents'])} agent(s)")
    for column in ("agent", "region", "used / capacity", "version", "last seen", "state"):
        agents_table.add_column(column)
    for agent in view["agents"]:
        agents_table.add_row(
            agent["agent_id"], agent["region"], f"{agent['used']} / {agent['capacity']}", agent["version"],
            agent["last_seen"][:19], "[green]online[/green]" if agent["online"] else "[red]offline[/red]",
        )
    console.print(agents_table)


def _ago(iso: str) -> str:
    seconds = max(0, int((datetime.now(timezone.utc) - datetime.fromisoformat(iso)).total_seconds()))
    return f"{seconds}s ago" if seconds < 120 else f"{seconds // 60}m ago" if seconds < 7200 else f"{seconds // 3600}h ago"


@app.command("agents")
def agents_command(
    as_json: bool = typer.Option(False, "--json", help="print the fleet as JSON"),
    stack_file: Optional[Path] = StackOption,
) -> None:
    """The fleet per region affinity: each agent online or offline, last seen, capacity used / total, the stages it runs, its version."""
    stack = _stack(stack_file)
    with _api(stack_file) as api:
        agents = api.queue()["agents"]
    regions = sorted(set(stack.work_queues) | {agent["region"] for agent in agents})
    if as_json:
        sys.stdout.write(json.dumps({region: [a for a in agents if a["region"] == region] for region in regions}, indent=2) + "\n")
        return
    for region in regions:
        here = [agent for agent in agents if agent["region"] == region]
        online = [agent for agent in here if agent["online"]]
        table = Table(title=f"{region}: {len(online)} of {len(here)} agent(s) online")
        for column in ("agent", "state", "last seen", "used / capacity", "running stages", "version"):
            table.add_column(column)
        for agent in here:
            stages = ", ".join(f"{s['job_id']} {s['stage']}#{s['attempt']}" for s in agent.get("running_stages", []))
            table.add_row(
                agent["agent_id"], "[green]online[/green]" if agent["online"] else "[red]offline[/red]",
                f"{agent['last_seen'][:19]} ({_ago(agent['last_seen'])})", f"{agent['used']} / {agent['capacity']}",
                stages or "-", agent["version"],
            )
        if here:
            console.print(table)
        else:
            console.print(f"{region}: no agents (a local one: relevo local agent --region {region})", markup=False, highlight=False, soft_wrap=True)


@app.command("promote")
def promote(job_id: str = JobId, stack_file: Optional[Path] = StackOption) -> None:
    """Move a queued job to the front: its priority becomes the highest queued priority + 1."""
    with _api(stack_file) as api:
        result = api.promote_job(job_id)
    console.print(f"job [bold]{result['job_id']}[/bold] promoted: priority {result['previous_priority']} -> {result['priority']}")


@job_app.command("priority")
def job_priority(
    job_id: str = JobId,
    priority: int = typer.Argument(..., help="higher runs first (a negative value goes after --, e.g. -- -5)"),
    stack_file: Optional[Path] = StackOption,
) -> None:
    """Set the priority of a queued job; it moves to its new place in line at once."""
    with _api(stack_file) as api:
        result = api.set_priority(job_id, priority)
    console.print(f"job [bold]{result['job_id']}[/bold] priority {result['previous_priority']} -> {result['priority']}")


@job_app.command("delete")
def job_delete(
    job_id: str = JobId,
    yes: bool = typer.Option(False, "--yes", "-y", help="do not ask for confirmation"),
    stack_file: Optional[Path] = StackOption,
) -> None:
    """Delete an ended job with its stage records, log chunks and artifact records (safe to repeat
    if it was interrupted). The artifact files themselves expire by the bucket's lifecycle rule."""
    if not yes:
        typer.confirm(f"delete job {job_id} with its logs and artifact records?", abort=True)
    with _api(stack_file) as api:
        result = api.delete_job(job_id)
    removed = result["removed"]
    console.print(
        f"job [bold]{result['job_id']}[/bold] ({result['status']}) deleted with {removed['stages']} stage record(s), "
        f"{removed['log_chunks']} log chunk(s) and {removed['artifacts']} artifact record(s)"
    )
@app.command("logs")
def logs(
    job_id: str = JobId,
    follow: bool = typer.Option(False, "--follow", "-f", help="keep printing until the job ends; exit 0 if it succeeded, 1 if not"),
    from_seq: int = typer.Option(0, "--from-seq", min=0, help="start at this chunk (job show's log_tail.next_seq: right after its tail)"),
    poll_sec: float = typer.Option(1.0, "--poll", min=0.1, help="seconds between polls while following"),
    stack_file: Optional[Path] = StackOption,
) -> None:
    """Print a job's output (already masked); with -f follow it, across dropped connections."""
    from relevo_cli.follow import LogFollower

    def write(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    def gate_reached(page: dict) -> None:
        # Following goes quiet while the job waits for a person: say for whom, and what to run.
        if page.get("waiting_stage"):
            errors.print(gate_line(job_id, page["waiting_stage"]), markup=False, highlight=False, soft_wrap=True)

    with _api(stack_file) as api:
        follower = LogFollower(
            fetch=lambda seq: api.job_logs(job_id, from_seq=seq),
            write=write,
            warn=lambda message: errors.print(f"[yellow]{message}[/yellow]"),
            status_changed=gate_reached,
            poll_sec=poll_sec,
            next_seq=from_seq,
        )
        code = follower.run(follow)
    if follow:
        errors.print(f"job {job_id} {follower.status}")
    raise typer.Exit(code)


artifacts_app = typer.Typer(no_args_is_help=True, help="Files the stages of a job uploaded.")
app.add_typer(artifacts_app, name="artifacts")


@artifacts_app.command("list")
def artifacts_list(job_id: str = JobId, stack_file: Optional[Path] = StackOption) -> None:
    """A job's artifacts, with the sha256 recorded at upload."""
    with _api(stack_file) as api:
        job = api.get_job(job_id)
    table = Table(title=f"{len(job['artifacts'])} artifact(s) of {job_id}")
    for column in ("stage", "name", "size", "sha256"):
        table.add_column(column)
    for artifact in job["artifacts"]:
        table.add_row(artifact["stage"], artifact["name"], str(artifact["size"]), artifact["sha256"])
    console.print(table)


@artifacts_app.command("get")
def artifacts_get(
    job_id: str = JobId,
    name: str = typer.Argument(..., help="the file's path under the stage's artifact directory"),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="file or directory to write (default: its name, here)"),
    stage: Optional[str] = typer.Option(None, "--stage", help="the stage that uploaded it (when several did)"),
    stack_file: Optional[Path] = StackOption,
) -> None:
    """Download an artifact (presigned link valid 2 minutes) and verify its sha256."""
    from relevo_cli.artifacts import ChecksumMismatch, download

    with _api(stack_file) as api:
        link = api.artifact_link(job_id, name, stage)
    try:
        path = download(link, output or Path(Path(name).name))
    except ChecksumMismatch as exc:
        errors.print(f"[red]{exc}[/red]")
        raise typer.Exit(1) from exc
    console.print(f"{path} ({link['size']} bytes, sha256 {link['sha256']} verified)")


app.command("drill")(drill_command)  # relevo_cli.drill: the disaster drill


if __name__ == "__main__":
    app()
