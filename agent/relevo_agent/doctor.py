"""`relevo-agent doctor`: checks what the agent needs before it can take work, and says in plain
words what is wrong: AWS credentials, the table and the region's work queue, the clock (leases are
compared across machines), disk space for workspaces and, with run_as, what of the agent's the
build user could read."""

from __future__ import annotations

import os
import pwd
import shutil
import stat
from collections.abc import Callable
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

from relevo_agent.config import AgentConfig
from relevo_agent.journal import last_stack
from relevo_core.aws import client, error_words
from relevo_core.checks import Check, Verdict
from relevo_core.files.stack import StackInfo
from relevo_core.fleet import lease_timeline

# The allowed skew the lease timeline fences with (relevo_core.fleet.lease_timeline): one number. The
# agent's max_clock_skew_sec sets it; SigV4 itself refuses requests more than 5 minutes off.
MAX_CLOCK_SKEW_SEC = lease_timeline.MAX_CLOCK_SKEW_SEC


def _server_date(response: dict[str, Any]) -> datetime | None:
    header = response.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
    return parsedate_to_datetime(header) if header else None


def check_credentials() -> tuple[Check, datetime | None]:
    try:
        identity = client("sts").get_caller_identity()
    except NoCredentialsError:
        return Check(
            "credentials", Verdict.FAIL, "no AWS credentials found (set AWS_PROFILE or run `aws configure`)"
        ), None
    except (ClientError, BotoCoreError) as exc:
        return Check("credentials", Verdict.FAIL, f"AWS refused the credentials ({error_words(exc)})"), None
    return Check("credentials", Verdict.OK, f"signed in as {identity.get('Arn', '?')}"), _server_date(
        identity
    )


def check_table(table: str, region: str) -> Check:
    try:
        # A read of its region's presence partition is what the agent role allows on its own
        # credentials (everything of a job it reads with that job's, after a claim); the key
        # does not need to exist.
        client("dynamodb").get_item(
            TableName=table, Key={"pk": {"S": f"AGENTS#{region}"}, "sk": {"S": "AGENT#relevo-doctor"}}
        )
    except (ClientError, BotoCoreError) as exc:
        return Check("table", Verdict.FAIL, f"cannot read table {table} ({error_words(exc)})")
    return Check("table", Verdict.OK, f"{table} is readable")


def check_queue(queue_url: str) -> Check:
    try:
        attributes = client("sqs").get_queue_attributes(
            QueueUrl=queue_url, AttributeNames=["ApproximateNumberOfMessages"]
        )["Attributes"]
    except (ClientError, BotoCoreError) as exc:
        return Check("queue", Verdict.FAIL, f"cannot reach the work queue {queue_url} ({error_words(exc)})")
    return Check(
        "queue",
        Verdict.OK,
        f"reachable, {attributes.get('ApproximateNumberOfMessages', '?')} stage(s) waiting",
    )


def check_clock(server: datetime | None, local: datetime, max_skew_sec: float = MAX_CLOCK_SKEW_SEC) -> Check:
    if server is None:
        return Check(
            "clock", Verdict.FAIL, "could not read AWS's time to compare with (see the credentials check)"
        )
    skew = (local - server).total_seconds()
    # The Date header has whole seconds: allow that second on top.
    if abs(skew) > max_skew_sec + 1:
        ahead = "ahead of" if skew > 0 else "behind"
        return Check(
            "clock",
            Verdict.FAIL,
            f"this Mac's clock is {abs(skew):.0f}s {ahead} AWS; turn on automatic time (sntp / System "
            "Settings)",
        )
    return Check("clock", Verdict.OK, f"within {max_skew_sec:.0f}s of AWS")


def check_stack(journal: Path, table: str | None, queue_url: str | None, endpoint: str | None) -> Check:
    """What changed since the agent last ran: the stack its journal remembers against the one the
    config names now (an agent exits when its stack goes away; its restart reads the config)."""
    last = last_stack(journal)
    if last is None:
        return Check("stack", Verdict.OK, "no earlier run of this agent recorded in its journal")
    now = {"endpoint": endpoint, "table": table, "queue": queue_url}
    changed = [f"{name} {last.get(name)} -> {now[name]}" for name in now if last.get(name) != now[name]]
    if not changed:
        return Check(
            "stack",
            Verdict.OK,
            f"the same stack as the agent's last run ({last.get('at', '?')}): table {table}",
        )
    return Check(
        "stack",
        Verdict.OK,
        f"changed since the agent's last run ({last.get('at', '?')}): {'; '.join(changed)}",
    )


def _existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_disk(workspace_root: Path, min_free_gb: float) -> Check:
    free_gb = shutil.disk_usage(_existing(workspace_root)).free / 1024**3
    if free_gb < min_free_gb:
        return Check(
            "disk",
            Verdict.FAIL,
            f"only {free_gb:.1f} GiB free under {workspace_root}; at least {min_free_gb:g} GiB needed",
        )
    return Check("disk", Verdict.OK, f"{free_gb:.1f} GiB free under {workspace_root}")


def check_writable(name: str, directory: Path) -> Check:
    target = _existing(directory)
    if not os.access(target, os.W_OK):
        return Check(name, Verdict.FAIL, f"{target} is not writable by this user")
    return Check(name, Verdict.OK, f"{directory} can be written")


def _session_of(arn: str) -> str:
    """The role a session ARN (arn:aws:sts::ACCOUNT:assumed-role/NAME/SESSION) belongs to."""
    if ":assumed-role/" not in arn:
        return arn
    account, name = arn.split(":")[4], arn.split(":assumed-role/")[1].split("/")[0]
    return f"arn:{arn.split(':')[1]}:iam::{account}:role/{name}"


def check_permissions(stack: StackInfo, region: str, identity: str | None) -> Check:
    """What these credentials may do, probed without changing anything (relevo_agent.permissions),
    against what the region's agent role allows."""
    from relevo_agent import permissions

    queue_url = stack.work_queues.get(region, "")
    others = {name: url for name, url in stack.work_queues.items() if name != region}
    findings = [
        permissions.run(probe)
        for probe in permissions.probes(
            stack.table_name,
            region,
            queue_url,
            others,
            stack.resources.get("ArtifactBucket"),
            stack.resources.get("JobStateMachine"),
            stack.stack_name,
            stack.api_url,
            stack.region,
        )
    ]
    ok, words = permissions.summary(findings)
    role = stack.agent_roles.get(region)
    if identity and role:
        words += (
            f"; {'they are' if _session_of(identity) == role else 'not'} the agent role of {region} ({role})"
        )
    return Check("permissions", Verdict.OK if ok else Verdict.FAIL, words)


def check_outside_repositories(workspace_root: Path) -> Check:
    """A workspace inside someone's repository would have a stage's git act on that repository."""
    from relevo_agent.checkout import inside_git_work_tree

    repository = inside_git_work_tree(workspace_root)
    if repository is not None:
        return Check(
            "workspace repository",
            Verdict.FAIL,
            f"{workspace_root} is inside the git work tree {repository}: move workspace_root out of it",
        )
    return Check("workspace repository", Verdict.OK, f"{workspace_root} is inside no git work tree")


def agent_private_files(config: AgentConfig, config_path: Path | None) -> list[Path]:
    """What the agent reads and a build must not: its config, its journal (and SQLite's -wal and
    -shm beside it), its stack file, and the AWS configuration and credentials of its user."""
    paths = [config_path] if config_path is not None else []
    paths += [config.journal.with_name(config.journal.name + suffix) for suffix in ("", "-wal", "-shm")]
    if config.stack_file is not None:
        paths.append(config.stack_file)
    homes = {os.environ.get("HOME") or "", pwd.getpwuid(os.geteuid()).pw_dir} - {""}
    for name, default in (("AWS_SHARED_CREDENTIALS_FILE", "credentials"), ("AWS_CONFIG_FILE", "config")):
        paths += (
            [Path(os.environ[name])]
            if os.environ.get(name)
            else [Path(home) / ".aws" / default for home in sorted(homes)]
        )
    return [
        path for path in dict.fromkeys(paths) if path.is_file()
    ]  # not /dev/null, as AWS_CONFIG_FILE may be


def check_build_user(config: AgentConfig, config_path: Path | None) -> list[Check]:
    """With run_as: who the stages run as, and a warning for each private file of the agent's that
    user could read (by the mode bits and owners of the file and of the directories above it)."""
    user = config.build_user
    if user is None:
        return []
    checks = [
        Check(
            "build user",
            Verdict.OK,
            f"stages run as {user.name} (uid {user.uid}, gid {user.gid}, home {user.home})",
        )
    ]
    readable = [path for path in agent_private_files(config, config_path) if user.can_read(path)]
    if readable:
        shown = ", ".join(f"{path} ({stat.filemode(path.stat().st_mode)})" for path in readable)
        checks.append(
            Check(
                "private files", Verdict.WARN, f"the build user {user.name} can read {shown}: chmod 600 each"
            )
        )
    else:
        checks.append(
            Check(
                "private files",
                Verdict.OK,
                f"the build user {user.name} can read none of the agent's config, journal, stack file and "
                "AWS files",
            )
        )
    return checks


def run_checks(
    config: AgentConfig,
    table: str | None,
    queue_url: str | None,
    no_queue: str | None = None,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
    stack: StackInfo | None = None,
    config_path: Path | None = None,
) -> list[Check]:
    credentials, server_time = check_credentials()
    checks = [credentials, check_clock(server_time, now(), config.max_clock_skew_sec)]
    if stack is not None and credentials.ok and config.region in stack.work_queues:
        checks.append(
            check_permissions(stack, config.region, credentials.words.removeprefix("signed in as "))
        )
    checks.append(
        check_table(table, config.region)
        if table
        else Check("table", Verdict.FAIL, "no table: set stack_file or table_name")
    )
    if queue_url:
        checks.append(check_queue(queue_url))
    else:
        checks.append(
            Check(
                "queue",
                Verdict.FAIL,
                no_queue or f"no work queue for region {config.region!r}: set stack_file or queue_url",
            )
        )
    checks.append(check_stack(config.journal, table, queue_url, os.environ.get("AWS_ENDPOINT_URL")))
    checks.append(check_disk(config.workspace_root, config.min_free_disk_gb))
    checks.append(check_writable("workspaces", config.workspace_root))
    checks.append(check_outside_repositories(config.workspace_root))
    checks.append(check_writable("journal", config.journal.parent))
    checks += check_build_user(config, config_path)
    return checks
