"""relevo-agent's TOML configuration."""

from __future__ import annotations

import re
import socket
import tomllib
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from relevo_agent.build_user import BuildUser, BuildUserProblem
from relevo_agent.build_user import check as check_build_user
from relevo_core.files.user_written import (
    FileMistake,
    InvalidFile,
    Loc,
    Locator,
    field_name,
    read_text,
    validate,
)
from relevo_core.fleet.lease_timeline import MAX_CLOCK_SKEW_SEC
from relevo_core.models.capabilities import REQUIREMENT_KEY

# An AWS region's name (eu-west-1, us-gov-west-1, ap-southeast-2).
_AWS_REGION = re.compile(r"^[a-z]{2}(-gov|-iso[a-z]*)?-[a-z]+-[0-9]+$")

# Retention the agent once took from its own config; now the stack's parameters (template.yaml).
_STACK_RETENTION = {"log_retention_days": "LogRetentionDays", "artifact_retention_days": "JobRetentionDays"}


class ReleaseEndpoints(BaseModel):
    """Where a stage's built-in release effects (docs/release-effects.md) send their requests."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    app_store_connect: str = Field(
        default="https://api.appstoreconnect.apple.com",
        pattern=r"^https?://[^\s/]+(/\S*)?$",
        description="App Store Connect API's base URL (app_store_upload).",
    )
    notary: str = Field(
        default="https://appstoreconnect.apple.com/notary/v2",
        pattern=r"^https?://[^\s/]+(/\S*)?$",
        description="The Notary API's base URL (notarization).",
    )
    github: str = Field(
        default="https://api.github.com",
        pattern=r"^https?://[^\s/]+(/\S*)?$",
        description="GitHub's REST API base URL (github_release_asset); a GitHub Enterprise Server's "
        "https://<host>/api/v3.",
    )
    notary_upload: str | None = Field(
        default=None,
        pattern=r"^https?://[^\s/]+(/\S*)?$",
        description="Where a notarization's file is uploaded with the temporary credentials Apple's answer "
        "carries: Apple's S3 (https://s3.us-west-2.amazonaws.com) by default; the local Apple service's "
        "stand-in in tests and the demo.",
    )
    stapler: list[Annotated[str, Field(min_length=1)]] | None = Field(
        default=None,
        min_length=1,
        max_length=8,
        description="The command that staples a notarization's ticket, given `validate <file>` or "
        "`staple <file>`: `xcrun stapler` on macOS by default; none elsewhere (a stage that staples then "
        "fails before it submits anything).",
    )
    poll_sec: float | None = Field(
        default=None,
        gt=0,
        le=300,
        description="How often an effect that waits on Apple (an upload's processing, a notarization's "
        "review) asks again: every 30 s for an upload and 15 s for a notarization by default; a second "
        "against the local Apple service, whose processing takes seconds (the demo).",
    )


class AgentConfig(BaseModel):
    """relevo-agent's configuration (TOML; relative paths are relative to the file)."""

    model_config = ConfigDict(extra="forbid", frozen=True, title="relevo-agent config")

    agent_id: str = Field(
        default_factory=socket.gethostname,
        min_length=1,
        max_length=128,
        description="This agent's name in stage records, presence and logs. Default: the host name.",
    )
    region: str = Field(
        pattern=r"^[a-z][a-z0-9-]{0,31}$",
        description="The region affinity whose work queue this agent polls (one of the stack's "
        "RegionAffinities): a name "
        "of the fleet's own, such as eu-west, not an AWS region (the stack file, or aws_region, gives that).",
    )
    capacity: int = Field(
        default=2, description="How many stages this agent runs at once; 0 or less means 1."
    )
    workspace_root: Path = Field(
        default=Path("~/relevo/workspaces"),
        description="One exclusive workspace per project: <workspace_root>/<project>.",
    )
    journal: Path = Field(
        default=Path("~/relevo/journal.sqlite3"),
        description="The agent's SQLite journal of the operations it ran (keep it across restarts).",
    )
    # A local stack.json, or the explicit names below for a deployed stack.
    stack_file: Path | None = Field(
        default=None,
        description="A stack.json (written by `relevo local up`, or by hand for a deployed stack) naming "
        "the table "
        "and the work queues. Either this, or table_name and queue_url.",
    )
    table_name: str | None = Field(
        default=None, description="The deployed stack's table (its TableName output), without stack_file."
    )
    queue_url: str | None = Field(
        default=None, description="The URL of this region's work queue, without stack_file."
    )
    api_url: str | None = Field(
        default=None,
        pattern=r"^https?://[^\s]+$",
        description="The deployed stack's API (its ApiUrl output), without stack_file: the agent claims "
        "each stage there "
        "and gets the job's credentials with the claim.",
    )
    aws_region: str | None = Field(
        default=None, description="The AWS region of the deployed stack, without stack_file."
    )
    aws_profile: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9_.@+-]{1,64}$",
        description="The profile of this Mac's AWS configuration the agent runs with: the one that takes "
        "the region's "
        'agent role (docs/operations.md, "Connect a Mac"). Empty: the default credential chain.',
    )
    mask: tuple[str, ...] = Field(
        default=(),
        description="Names of environment variables whose values are secrets: replaced by `******` in every "
        "log and probe output.",
    )
    release_endpoints: ReleaseEndpoints = Field(
        default=ReleaseEndpoints(),
        description="Where the built-in release effects send their requests (`[release_endpoints]`: "
        "app_store_connect, notary, github): Apple's and GitHub's own by default; the local Apple service "
        "in tests and the demo.",
    )
    labels: dict[
        Annotated[str, Field(pattern=REQUIREMENT_KEY)], Annotated[str, Field(min_length=1, max_length=64)]
    ] = Field(
        default_factory=dict,
        max_length=32,
        description="Facts of this Mac a stage's `requires` can name besides what the agent detects (os, "
        "macos, arch, "
        'xcode), e.g. `labels = {signing = "enterprise"}`. A label never overrides a detected fact.',
    )
    requirement_recheck_sec: int = Field(
        default=10,
        ge=1,
        le=900,
        description="A stage whose `requires` no online agent of the region meets is put back on the queue, "
        "delayed "
        "this long (SQS message timer, at most 900 s), by whichever agent received it.",
    )
    min_free_disk_gb: float = Field(
        default=10,
        ge=0,
        description="Below this much free space under workspace_root the agent claims no stage (queue reason "
        "agent_low_disk, said in its presence) and `relevo-agent doctor` fails.",
    )
    keep_workspaces: int = Field(
        default=0,
        ge=0,
        le=1000,
        description="Keep the workspaces of this many projects used last; older ones are removed while the "
        "agent is "
        "idle, never one a lease holds. 0: keep every workspace.",
    )
    cleanup_timeout_sec: int = Field(
        default=600,
        ge=1,
        le=7200,
        description="How long a project's workspace_cleanup command may run between stages.",
    )
    security_tool: Path | None = Field(
        default=None,
        description="The `security` command that makes a job's temporary signing keychain (a project's "
        "signing.keychain: temporary). Default: /usr/bin/security on macOS; on another OS such a stage "
        "fails with "
        "Relevo.Fatal.KeychainUnsupported. Set it only to use another build of the tool, or a recorded "
        "double in tests.",
    )
    security_timeout_sec: float = Field(
        default=60,
        gt=0,
        le=600,
        description="How long one `security` command of a signing keychain may take.",
    )
    poll_wait_sec: int = Field(
        default=20,
        ge=0,
        le=20,
        description="The long poll of the work queue, in seconds (SQS allows up to 20).",
    )
    presence_interval_sec: float = Field(
        default=30,
        gt=0,
        le=300,
        description="How often the agent writes its presence record; it counts as offline after 3 intervals "
        "without one.",
    )
    handoff_delay_sec: int = Field(
        default=2,
        ge=0,
        le=60,
        description="A retry that should go to another agent with a free slot is handed back for this long "
        "(for a "
        "busy agent the hops are longer, and the message is visible again as soon as a slot frees for it).",
    )
    handoff_max_wait_sec: int = Field(
        default=60,
        ge=0,
        le=3600,
        description="Safety bound: a handed-back retry is taken by this agent anyway once it was dispatched "
        "this long "
        "ago (at most half the job's queue timeout), so a stage never starves behind a busy agent.",
    )
    log_flush_interval_sec: float = Field(
        default=0.2,
        gt=0,
        le=10,
        description="The longest a stage's printed line waits before it is stored in the job's log (a chunk "
        "that "
        "fills sooner is stored at once): what `relevo job logs -f` and the console can show is at most "
        "this late.",
    )
    outbox_interval_sec: float = Field(
        default=5.0,
        gt=0,
        le=300,
        description="How often reports the network lost are sent again from the journal's outbox.",
    )
    progress_interval_sec: float = Field(
        default=2.0,
        gt=0,
        le=300,
        description="The least time between two readings of an artifact upload's progress written on its "
        "stage (files "
        "and bytes done, for `relevo job view` and the console's Steps). A reading rides on a lease "
        "renewal, so it is "
        "also never more often than those (every min(lease/3, 3 s)); the upload's end is written at once.",
    )
    artifact_upload_max_bandwidth: int | None = Field(
        default=None,
        ge=1024,
        description="Bytes per second each artifact file is uploaded at, at most (none: as fast as the link "
        "allows), "
        "so a Mac's uploads leave room on a shared link.",
    )
    handoff_cache_gb: float = Field(
        default=20,
        ge=0,
        le=10_000,
        description="This Mac's cache of handed-on files (under workspace_root/.relevo-cache), so that a "
        "later stage "
        "here restores them without downloading, even after the checkout's git clean. Files no workspace "
        "holds any "
        "more are removed between stages, oldest first, past this size. 0: no cache.",
    )
    prefer_previous_sec: int = Field(
        default=10,
        ge=0,
        le=300,
        description="When the stage before handed on or restored files, a job's next stage is passed on to "
        "the Mac "
        "that ran it (the files are there) for up to this long, and only while that Mac waits for work "
        "(online, a free "
        "slot, taking stages, meeting the stage's requires): a busy or absent Mac is not waited for. Then "
        "any Mac of "
        "the region takes it. A retry still prefers another Mac. 0: no preference.",
    )
    network_region: str | None = Field(
        default=None,
        pattern=r"^[a-z]{2}(-gov|-iso[a-z]*)?-[a-z]+-[0-9]+$",
        description="The AWS region this Mac sits in or nearest to (its data center's, e.g. eu-central-1): "
        "bytes between "
        "it and a bucket of another region count as cross_region_bytes. Default: the region affinity when "
        "it is an AWS "
        "region's name; otherwise not known, and cross_region_bytes says so (null).",
    )
    run_as: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$",
        description="The OS user each stage's command, effect probe, checkout and workspace_cleanup run as "
        "(its uid, "
        "groups and home), who cannot read the agent's config, journal, stack file or AWS credentials. The "
        "agent must then "
        "run as root (a LaunchDaemon) and workspace_root must be reachable by that user; a signing keychain "
        "is not made "
        'then (docs/agent.md, "A build user"). None: stages run as the agent\'s own user.',
    )
    max_clock_skew_sec: float = Field(
        default=MAX_CLOCK_SKEW_SEC,
        ge=0,
        le=60,
        description="The clock skew allowed between this Mac and AWS: `relevo-agent doctor` fails beyond "
        "it, the lease "
        "keeper fences this much (plus the kill grace) before the lease ends, and a successor waits this "
        "long past the "
        "previous holder's lease end.",
    )

    @model_validator(mode="before")
    @classmethod
    def _retention_is_the_stacks(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name, parameter in _STACK_RETENTION.items():
                if name in data:
                    raise ValueError(
                        f"{name} is not an agent setting: the stack's {parameter} parameter decides, "
                        "and each job's envelope carries it to the agent; remove it from the config"
                    )
        return data

    @property
    def location_region(self) -> str | None:
        """The AWS region this Mac's traffic counts as local to, when known."""
        if self.network_region:
            return self.network_region
        return self.region if _AWS_REGION.match(self.region) else None

    @property
    def build_user(self) -> BuildUser | None:
        """The user stages run as (checked when the config was loaded), or None: the agent's own."""
        return BuildUser.named(self.run_as) if self.run_as else None

    @field_validator("capacity")
    @classmethod
    def _at_least_one(cls, value: int) -> int:
        return max(1, value)

    @classmethod
    def load(cls, path: Path) -> AgentConfig:
        """The config of `path`; any mistake in it is an InvalidFile naming its line and key."""
        text = read_text(path, "agent config")
        config = validate(cls, parse_toml(path, text), path, toml_locator(text))
        base = path.parent
        updates = {
            "workspace_root": (base / config.workspace_root.expanduser()).resolve(),
            "journal": (base / config.journal.expanduser()).resolve(),
        }
        if config.security_tool is not None:
            updates["security_tool"] = (base / config.security_tool.expanduser()).resolve()
        if config.stack_file is not None:
            updates["stack_file"] = (base / config.stack_file.expanduser()).resolve()
        config = config.model_copy(update=updates)
        if config.run_as is not None:
            try:
                user = check_build_user(config.run_as)
            except BuildUserProblem as problem:
                raise config_mistake(path, ("run_as",), str(problem)) from None
            unreachable = user.cannot_reach(config.workspace_root)
            if unreachable:
                raise config_mistake(
                    path,
                    ("workspace_root",),
                    f"the build user {user.name!r} cannot reach {config.workspace_root} ({unreachable}): "
                    "choose a workspace_root "
                    "outside the agent's home, e.g. /Users/Shared/relevo/workspaces",
                )
        return config


_TOML_POSITION = re.compile(r"\s*\(at line (\d+), column (\d+)\)$")
_TOML_KEY = re.compile(r"""^\s*(?:"([^"]+)"|'([^']+)'|([A-Za-z0-9_-]+))\s*=""")


def parse_toml(path: Path, text: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        # Python 3.11's message ends with "(at line L, column C)"; 3.14 also has lineno / colno.
        message = str(exc)
        position = _TOML_POSITION.search(message)
        line, column = (int(position.group(1)), int(position.group(2))) if position else (None, None)
        raise InvalidFile.one(path, f"TOML syntax: {_TOML_POSITION.sub('', message)}", line, column) from None


def toml_locator(text: str) -> Locator:
    """Lines of the top-level keys of a TOML file (the agent's config is flat): enough to name
    the line of a key whose value is wrong."""
    lines: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if line.lstrip().startswith("["):
            break  # a table: its keys are not the agent's
        match = _TOML_KEY.match(line)
        if match:
            lines.setdefault(next(group for group in match.groups() if group), number)

    def locate(loc: Loc) -> int | None:
        return lines.get(str(loc[0])) if loc else None

    return locate


def config_mistake(path: Path, loc: Loc, message: str) -> InvalidFile:
    """A mistake in the config found after loading it (against the stack it names)."""
    try:
        line = toml_locator(path.read_text(encoding="utf-8", errors="replace"))(loc)
    except OSError:
        line = None
    return InvalidFile([FileMistake(path, message, line, field=field_name(loc))])
