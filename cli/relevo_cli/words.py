"""What the CLI and the console say of a job in words rather than as stored: a failure as a sentence
(the stored error is a class name and a JSON cause), a time relative to now with its exact value
beside it, how long something ran, and which Mac ran which stages (and shards)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

# What each failure class means, said of the stage that failed with it.
_CLASS_WORDS = {
    "Relevo.Fatal.ExitCode": "its command exited {exit}",
    "Relevo.Transient.ExitCode": "its command exited {exit}, a code the project marks transient",
    "Relevo.Transient.NetworkTimeout": "the network timed out",
    "Relevo.Transient.ConnectionReset": "a connection was reset",
    "Relevo.Transient.Storage5xx": "the artifact storage answered with a server error",
    "Relevo.Transient.AgentShutdown": "its agent was shut down while it ran",
    "Relevo.Lease.Expired": "its agent stopped renewing its lease (it stopped, or lost the network)",
    "Relevo.Fatal.CertificateExpired": "a signing certificate has expired",
    "Relevo.Fatal.ProfileMismatch": "the provisioning profile does not match",
    "Relevo.Fatal.ToolchainDrift": "the Mac's toolchain is not the one the stage expects",
    "Relevo.Fatal.Checksum": "a file handed on from an earlier stage did not match its checksum",
    "Relevo.Fatal.Client4xx": "a service refused a request of the stage",
    "Relevo.Fatal.ArtifactQuota": "its artifacts would take the job past its artifact.max_job_bytes",
    "Relevo.Fatal.KeychainUnsupported": "its agent cannot make a signing keychain (not macOS, or run_as)",
    "Relevo.Fatal.Keychain": "its signing keychain could not be made",
    "Relevo.Fatal.Checkout": "the job's commit could not be checked out",
    "Relevo.Fatal.HandoffMissing": "a path it hands on matched nothing",
    "Relevo.Fatal.HandoffPath": "a path it hands on leads out of the workspace",
    "Relevo.Fatal.HandoffGone": "an earlier stage's handed-on files are no longer stored",
    "Relevo.Fatal.HandoffConflict": "two shards of an earlier stage hand on the same path differently",
    "Relevo.Fatal.Output": "what it wrote to $RELEVO_OUTPUT is not key=value lines",
    "Relevo.Fatal.TestsMissing": "a shard did not run every test its plan gave it",
    "Relevo.Fatal.TestsUnplanned": "a shard ran a test twice, or one its plan did not give it",
    "Relevo.Fatal.TestPlan": "its test listing could not be made, or is not the one its plan was made of",
    "Relevo.Precondition.Changed": "its inputs changed between attempts, so it was not run again",
    "Relevo.Reconcile.ResolvedFailed": "an operator resolved its manual review as failed",
    "Relevo.Timeout.Queue": "no agent claimed it within its queue_timeout_sec",
    "Relevo.Timeout.Exec": "its command ran past its exec_timeout_sec",
    "Relevo.Approval.Rejected": "it was rejected at the approval gate",
    "Relevo.Approval.Timeout": "nobody answered its approval gate in time",
}

# What a class means said of the job as a whole, where no stage failed: a job that waited for
# its project's lock (job.asl.json's GiveUpWaiting) never reached an agent.
_JOB_CLASS_WORDS = {
    "Relevo.Timeout.Queue": "another job of its project held the project for its whole queue_timeout_sec, "
    "so it never started",
}


def _json(text: Any) -> dict[str, Any]:
    if isinstance(text, dict):
        return text
    try:
        value = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def error_sentence(job: dict[str, Any]) -> str | None:
    """A failed job's error as a sentence: which stage, on which Mac, what happened, after how many
    attempts, and the class name for searching (`notarize failed on mac-us-1: its command exited 1
    (Relevo.Fatal.ExitCode, 1 attempt).`). None when the job has no error."""
    name = job.get("error")
    if not name:
        return None
    detail = _json(job.get("error_cause"))
    cause = _json(detail.get("cause"))
    stage = detail.get("stage")
    agent = cause.get("agent_id") or next(
        (s.get("agent_id") for s in job.get("stages") or [] if s.get("name") == stage and s.get("agent_id")),
        None,
    )
    exit_code = cause.get("exit_code")
    words = (_JOB_CLASS_WORDS.get(name) if not stage else None) or _CLASS_WORDS.get(name, "it failed").format(
        exit=exit_code if exit_code not in (None, -1) else "non-zero"
    )
    attempts = detail.get("attempts")
    counted = f", {attempts} attempt{'s' if attempts != 1 else ''}" if isinstance(attempts, int) else ""
    said = [f"{stage} failed" if stage else "The job failed"]
    if agent:
        said.append(f" on {agent}")
    said.append(f": {words} ({name}{counted}).")
    why = (
        cause.get("why")
        or cause.get("keychain")
        or (detail.get("cause") if isinstance(detail.get("cause"), str) and not cause else None)
    )
    if why and why != "no cause was reported":
        said.append(f" {str(why)[:300]}")
    return "".join(said)


def attempt_words(entry: dict[str, Any]) -> str:
    """A failed attempt of the job view's attempts_log in words: `its command exited 75
    (Relevo.Transient.ExitCode)`; its cause's own text, when it is not JSON, after it."""
    name = entry.get("error") or entry.get("error_class") or ""
    cause = _json(entry.get("cause"))
    exit_code = cause.get("exit_code")
    words = _CLASS_WORDS.get(name, "it failed").format(
        exit=exit_code if exit_code not in (None, -1) else "non-zero"
    )
    said = f"{words} ({name})" if name else words
    why = cause.get("why") or (
        entry.get("cause") if isinstance(entry.get("cause"), str) and not cause else None
    )
    return f"{said}: {why}" if why and why != "no cause was reported" else said


def parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _at(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


def seconds_between(start: str | None, end: str | None, now: datetime) -> int | None:
    """Whole seconds from `start` to `end` (to `now` while there is no end); None before a start."""
    began = _at(start)
    if began is None:
        return None
    return max(0, int(((_at(end) or now) - began).total_seconds()))


def format_duration(seconds: int | None) -> str:
    """`42s`, `3m 5s`, `2h 7m`; `—` for none."""
    if seconds is None:
        return "—"
    if seconds >= 3600:
        return f"{seconds // 3600}h {(seconds % 3600) // 60}m"
    if seconds >= 60:
        return f"{seconds // 60}m {seconds % 60}s"
    return f"{seconds}s"


def exact_time(value: str | None) -> str:
    """`2026-12-02 12:25:37 UTC`: to the second, no microseconds, no offset to read."""
    moment = parse_time(value)
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if moment else ""


def time_ago(value: str | None, now: datetime) -> str:
    """`just now`, `42 s ago`, `5 min ago`, `3 h ago`, `2 days ago`, then the date."""
    moment = parse_time(value)
    if moment is None:
        return ""
    seconds = int((now - moment).total_seconds())
    if seconds < 5:
        return "just now"
    if seconds < 60:
        return f"{seconds} s ago"
    if seconds < 3600:
        return f"{seconds // 60} min ago"
    if seconds < 86400:
        return f"{seconds // 3600} h ago"
    if seconds < 7 * 86400:
        days = seconds // 86400
        return f"{days} day{'s' if days != 1 else ''} ago"
    return moment.astimezone(UTC).strftime("%Y-%m-%d")


def shard_name(stage: str, shard: dict[str, Any]) -> str:
    """A shard as views and logs name it: `test[2]`, `test[device=iPhone 16, os=18.2]`."""
    return f"{stage}[{shard['label']}]"


def artifact_stage(artifact: dict[str, Any]) -> str:
    """The stage that left an artifact, and for a stage with shards its shard: `test#shard-1`
    (as its object's path `test/shard-1/`, its operation id and its handoff name it)."""
    return (
        artifact["stage"]
        if artifact.get("shard") is None
        else f"{artifact['stage']}#shard-{artifact['shard']}"
    )


def macs_by_stage(job: dict[str, Any]) -> list[tuple[str, list[str]]]:
    """Which Mac ran which stages, in plan order: [(agent, [stages])]; a stage retried on another
    Mac counts for the one that ran its last attempt; a stage with shards, each shard for its own."""
    by_agent: dict[str, list[str]] = {}
    for stage in job.get("stages") or []:
        if stage.get("agent_id"):
            by_agent.setdefault(stage["agent_id"], []).append(stage["name"])
        for shard in stage.get("shards") or []:
            if shard.get("agent_id"):
                by_agent.setdefault(shard["agent_id"], []).append(shard_name(stage["name"], shard))
    return list(by_agent.items())
