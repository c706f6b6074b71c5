"""How `relevo job logs` (and the console's log banners) word a stage attempt's end and its
silence: `build succeeded on mac-1 after 8s`, `test[2] failed on mac-3: ...`, `2m` silent."""

from __future__ import annotations

from typing import Any

from relevo_cli.words import attempt_words, format_duration, parse_time
from relevo_core.jobs.reconciliations import decided_by_reconcile, reconciled_line

# Who printed a chunk: its stage, its attempt, and its shard (None: a stage without shards).
Owner = tuple[str, int, int | None]


def silence_words(seconds: float) -> str:
    """`45s`, `2m`, `1h 5m`: how long a stage printed nothing, to the minute past one."""
    if seconds < 60:
        return f"{int(seconds)}s"
    return format_duration(int(seconds) // 60 * 60).removesuffix(" 0s")


def _ran_for(started_at: str | None, ended_at: str | None) -> str:
    """` after 8s`: how long an attempt ran, when both ends are known."""
    start, end = parse_time(started_at), parse_time(ended_at)
    if start is None or end is None:
        return ""
    return f" after {format_duration(max(0, int((end - start).total_seconds())))}"


def end_words(
    owner: Owner, stage: dict[str, Any] | None, name: str | None = None, started_at: str | None = None
) -> str:
    """How a stage attempt (or a shard's) ended, in a few words, with how long it ran when the
    page says when it started and ended: `build succeeded on mac-1 after 8s`, `test#1 failed on
    mac-2 after 3s: Relevo.Transient.ExitCode, retried`, `lint warning: exit 3 (a warning exit
    code)`, `test[2] succeeded on mac-3 after 1m 2s`. `name`: how the owner is named (its stage's
    name, or the shard's `stage[label]`); `started_at`: when the attempt started, as a page said
    while it ran (a retried attempt's start is gone from its record by then)."""
    name = name or owner[0]
    attempt = owner[1]
    if stage is None:
        return f"{name}#{attempt} ended"
    if (stage.get("attempt") or 0) > attempt:
        failed: dict[str, Any] = next(
            (entry for entry in stage.get("failed_attempts") or [] if entry.get("attempt") == attempt), {}
        )
        where = f" on {failed['agent']}" if failed.get("agent") else ""
        where += _ran_for(started_at, failed.get("at"))
        return (
            f"{name}#{attempt} failed{where}: {failed.get('error') or 'no outcome'}, retried as attempt "
            f"{stage['attempt']}"
        )
    status = stage["status"]
    label = f"{name}#{attempt}" if attempt > 1 else name
    where = f" on {stage['agent_id']}" if stage.get("agent_id") else ""
    # The attempt decided an earlier one's effect rather than run: said as such, whatever it ended.
    reconciled = (
        reconciled_line(name, decided_by_reconcile(stage)) if stage.get("attempt") == attempt else None
    )
    if reconciled:
        return reconciled
    if status != "skipped":
        where += _ran_for(stage.get("started_at") or started_at, stage.get("ended_at"))
    if status == "succeeded":
        return f"{label} succeeded{where}"
    if status == "warning":
        return (
            f"{label} succeeded with warnings{where}: "
            f"{stage.get('warning') or 'see the lines marked ::warning::'}"
        )
    if status == "failed":
        exit_code = stage.get("exit_code")
        code = f"exit {exit_code}, " if exit_code not in (None, -1) else ""
        return f"{label} failed{where}: " + (
            _failed_shards(name, stage) or f"{code}{stage.get('error_class') or 'no cause recorded'}"
        )
    if status == "skipped":
        rejected = stage.get("rejected")
        if rejected:
            return f"{name} skipped: rejected by {rejected.get('actor')} at its approval gate" + (
                f": {rejected['reason']}" if rejected.get("reason") else ""
            )
        return f"{name} skipped" + (f" (done by {stage['reused_from']})" if stage.get("reused_from") else "")
    return f"{label} {status}"


def _failed_shards(name: str, stage: dict[str, Any]) -> str:
    """A stage with shards that failed: which of its shards failed, and how the first did (its
    command's exit in words, as `relevo job view` says it)."""
    failed = [
        shard for shard in stage.get("shards") or [] if shard["shard"] in (stage.get("failed_shards") or [])
    ]
    if not failed:
        return ""
    first = failed[0]
    exit_code = first.get("exit_code")
    words = (
        attempt_words({"error": first.get("error_class"), "cause": {"exit_code": exit_code}})
        if first.get("error_class")
        else "failed"
    )
    where = f" on {first['agent_id']}" if first.get("agent_id") else ""
    others = f" (and {len(failed) - 1} more shard{'s' if len(failed) > 2 else ''})" if len(failed) > 1 else ""
    return f"{name}[{first.get('label', first['shard'])}] failed{where}: {words}{others}"
