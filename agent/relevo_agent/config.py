"""relevo-agent's TOML configuration."""

from __future__ import annotations

import socket
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from relevo_core.lease_timeline import MAX_CLOCK_SKEW_SEC

# Retention the agent once took from its own config; now the stack's parameters (template.yaml).
_STACK_RETENTION = {"log_retention_days": "LogRetentionDays", "artifact_retention_days": "JobRetentionDays"}


class AgentConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    agent_id: str = Field(default_factory=socket.gethostname, min_length=1, max_length=128)
    region: str = Field(pattern=r"^[a-z][a-z0-9-]{0,31}$")
    capacity: int = 2
    workspace_root: Path = Path("~/relevo/workspaces")
    journal: Path = Path("~/relevo/journal.sqlite3")
    # A local stack.json, or the explicit names below for a deployed stack.
    stack_file: Path | None = None
    table_name: str | None = None
    queue_url: str | None = None
    aws_region: str | None = None
    # Names of environment variables whose values are secrets (masked in logs).
    mask: tuple[str, ...] = ()
    # `relevo-agent doctor` fails below this much free space under workspace_root.
    min_free_disk_gb: float = Field(default=10, ge=0)
    poll_wait_sec: int = Field(default=20, ge=0, le=20)
    # Presence: how often this agent writes its presence record (see relevo_agent.presence).
    presence_interval_sec: float = Field(default=30, gt=0, le=300)
    # A retry that should go to another agent with a free slot is handed back for this long
    # (see relevo_agent.presence; for a busy agent the hops are longer)...
    handoff_delay_sec: int = Field(default=2, ge=0, le=60)
    # ...and, as a safety bound, taken by this agent anyway once it was dispatched this long ago
    # (capped at half the job's queue timeout), so a stage never starves behind a busy agent.
    handoff_max_wait_sec: int = Field(default=60, ge=0, le=3600)
    # How often reports the network lost are sent again from the journal's outbox.
    outbox_interval_sec: float = Field(default=5.0, gt=0, le=300)
    # The clock skew allowed between this Mac and AWS: `doctor` fails beyond it, the lease keeper
    # fences this much (plus the kill grace) before the lease ends, and a successor waits this
    # long past the previous holder's lease end (relevo_core.lease_timeline).
    max_clock_skew_sec: float = Field(default=MAX_CLOCK_SKEW_SEC, ge=0, le=60)

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

    @field_validator("capacity")
    @classmethod
    def _at_least_one(cls, value: int) -> int:
        return max(1, value)

    @classmethod
    def load(cls, path: Path) -> "AgentConfig":
        data = tomllib.loads(path.read_text())
        config = cls.model_validate(data)
        base = path.parent
        updates = {
            "workspace_root": (base / config.workspace_root.expanduser()).resolve(),
            "journal": (base / config.journal.expanduser()).resolve(),
        }
        if config.stack_file is not None:
            updates["stack_file"] = (base / config.stack_file.expanduser()).resolve()
        return config.model_copy(update=updates)
