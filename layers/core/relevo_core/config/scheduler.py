"""The scheduler settings of the registry and the schedule trigger."""

# Annotations are evaluated as written (no `from __future__ import annotations`): pydantic would
# otherwise parse and evaluate each one again, at cold start, to build the models.

from functools import lru_cache

from pydantic import Field

from relevo_core.config import _Env


class SchedulerSettings(_Env):
    """Where the registry keeps project schedules (EventBridge Scheduler) and what they invoke."""

    schedule_group: str = Field(alias="SCHEDULE_GROUP", min_length=1, max_length=64)
    schedule_target_arn: str = Field(alias="SCHEDULE_TARGET_ARN", pattern=r"^arn:[a-z-]+:lambda:")
    scheduler_role_arn: str = Field(alias="SCHEDULER_ROLE_ARN", pattern=r"^arn:[a-z-]+:iam::")


@lru_cache(maxsize=1)
def scheduler_settings() -> SchedulerSettings:
    return SchedulerSettings.from_environ()
