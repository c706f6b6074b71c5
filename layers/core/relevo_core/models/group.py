"""A project group and its notification channels: a group's channels serve every project in it."""

# Annotations are evaluated as written (no `from __future__ import annotations`): pydantic would
# otherwise parse and evaluate each one again, at cold start, to build the models.

from enum import Enum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from relevo_core.models.shapes import PROJECT_ID


class GroupEvent(str, Enum):
    # Sent once on entering an approval gate; the gate's outcome (approved, rejected, timed out)
    # follows under the same event, and a job ended by its gate gets no job_failed.
    JOB_WAITING = "job_waiting"
    JOB_FAILED = "job_failed"
    JOB_SUCCEEDED = "job_succeeded"  # opt-in
    KEY_FROZEN = "key_frozen"
    AGENTS_OFFLINE = "agents_offline"  # the last online agent of a region the group's projects use went away


DEFAULT_EVENTS = (
    GroupEvent.JOB_WAITING,
    GroupEvent.JOB_FAILED,
    GroupEvent.KEY_FROZEN,
    GroupEvent.AGENTS_OFFLINE,
)
# Secrets the status reporter may read for channels (template.yaml, ReadChannelSecrets): only these.
CHANNEL_SECRET = r"^relevo/[A-Za-z0-9-]+/_notify/[A-Za-z0-9/_+=.@-]+$"
EMAIL = r"^[^@\s]{1,64}@[^@\s]{1,255}$"


class Channel(BaseModel):
    """One channel: a Slack incoming webhook, or email addresses (one model, not a union of two:
    a mistake in a group file is then named by its own key and line)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["slack", "email"]
    webhook_secret_ref: str | None = Field(
        default=None,
        pattern=CHANNEL_SECRET,
        max_length=512,
        description="slack: Secrets Manager name of the incoming webhook URL (the URL is itself a secret), "
        "under "
        "relevo/<stack>/_notify/ (no project id starts with _).",
    )
    addresses: tuple[Annotated[str, Field(pattern=EMAIL, max_length=320)], ...] | None = Field(
        default=None,
        min_length=1,
        max_length=20,
        description="email: each address gets an SNS email subscription of the group (it confirms it from "
        "the mail SNS sends).",
    )

    @model_validator(mode="after")
    def _fields_of_its_kind(self) -> "Channel":
        wanted, other = (
            ("webhook_secret_ref", "addresses")
            if self.kind == "slack"
            else ("addresses", "webhook_secret_ref")
        )
        if getattr(self, wanted) is None:
            raise ValueError(f"a {self.kind} channel needs {wanted}")
        if getattr(self, other) is not None:
            raise ValueError(f"a {self.kind} channel has no {other}")
        return self


class Group(BaseModel):
    """`relevo group apply FILE`: one item per group in the table."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=PROJECT_ID, description="The group's name, as projects name it in `group:`.")
    channels: tuple[Channel, ...] = Field(min_length=1, max_length=10)
    events: tuple[GroupEvent, ...] = Field(
        default=DEFAULT_EVENTS,
        min_length=1,
        description="The events the group hears: job_waiting, job_failed, job_succeeded (opt-in), "
        "key_frozen, agents_offline.",
    )

    @field_validator("events")
    @classmethod
    def _unique(cls, events: tuple[GroupEvent, ...]) -> tuple[GroupEvent, ...]:
        if len(set(events)) != len(events):
            raise ValueError("an event is named twice")
        return events
