"""The status reporter's environment (StatusReporterFunction)."""

# Annotations are evaluated as written (no `from __future__ import annotations`): pydantic would
# otherwise parse and evaluate each one again, at cold start, to build the models.

from functools import lru_cache

from pydantic import Field

from relevo_core.config import AccessSettings, TableSettings


class ChannelSettings(TableSettings):
    """What sending to a channel reads: the status reporter and `relevo group test` alike."""

    # Email channels: one topic for every group, each subscription filtered on the group.
    group_topic_arn: str = Field(alias="GROUP_TOPIC_ARN", pattern=r"^arn:[a-z-]+:sns:")
    connect_timeout_sec: float = Field(default=3.0, alias="HTTP_CONNECT_TIMEOUT_SEC", gt=0, le=30)
    read_timeout_sec: float = Field(default=5.0, alias="HTTP_READ_TIMEOUT_SEC", gt=0, le=30)
    attempts: int = Field(default=4, alias="SEND_ATTEMPTS", ge=1, le=8)
    # One delivery (all its attempts and waits) ends within this, whatever Retry-After asks.
    send_budget_sec: float = Field(default=20.0, alias="SEND_BUDGET_SEC", gt=0, le=300)
    backoff_base_sec: float = Field(default=0.5, alias="SEND_BACKOFF_BASE_SEC", ge=0, le=30)
    delivery_record_days: int = Field(default=14, alias="DELIVERY_RECORD_DAYS", ge=1, le=365)
    secret_max_age_sec: int = Field(default=300, alias="SECRET_MAX_AGE_SEC", ge=0)


class NotifySettings(ChannelSettings):
    # Events that could not be delivered, with the failure (an SQS queue of the reporter's own).
    dead_letter_queue_url: str = Field(alias="STATUS_DEAD_LETTER_QUEUE_URL", min_length=8)
    # The job state machines: a status links to its execution in the Step Functions console (the
    # common machine's, or the queued one's for a job that may have waited for its project).
    state_machine_arn: str = Field(alias="STATE_MACHINE_ARN", pattern=r"^arn:[a-z-]+:states:")
    queued_state_machine_arn: str = Field(alias="QUEUED_STATE_MACHINE_ARN", pattern=r"^arn:[a-z-]+:states:")

    @property
    def machines(self) -> tuple[str, str]:
        return (self.state_machine_arn, self.queued_state_machine_arn)

    # How long a once-per-transition marker is kept: longer than any redelivery of its record.
    notice_memory_days: int = Field(default=30, alias="NOTICE_MEMORY_DAYS", ge=1, le=365)


class GroupApiSettings(ChannelSettings, AccessSettings):
    """The groups and deliveries routes (GroupsFunction)."""

    # `relevo group test` answers within this, all channels together: API Gateway waits 29 s at
    # most for its integration (GroupsFunction's Timeout), and the records are written after it.
    test_budget_sec: float = Field(default=20.0, alias="GROUP_TEST_BUDGET_SEC", gt=0, le=25)


@lru_cache(maxsize=1)
def notify_settings() -> NotifySettings:
    return NotifySettings.from_environ()


@lru_cache(maxsize=1)
def group_api_settings() -> GroupApiSettings:
    return GroupApiSettings.from_environ()
