"""The sweeper's environment."""

# Annotations are evaluated as written (no `from __future__ import annotations`): pydantic would
# otherwise parse and evaluate each one again, at cold start, to build the models.

import re
from functools import lru_cache

from pydantic import Field, field_validator

from relevo_core.config import IntakeSettings
from relevo_core.models.shapes import REGION_AFFINITY


class SweeperSettings(IntakeSettings):
    # Where the owner hears that an idempotency key was frozen (the project notification topic).
    notification_topic_arn: str = Field(alias="NOTIFICATION_TOPIC_ARN", pattern=r"^arn:[a-z-]+:sns:")
    # The stack's region affinities (the RegionAffinities parameter, comma-separated): each one's
    # online agents are counted every sweep, an empty region included.
    regions: tuple[str, ...] = Field(alias="REGION_AFFINITIES", min_length=1)

    @field_validator("regions", mode="before")
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(region.strip() for region in value.split(",") if region.strip())
        return value

    @field_validator("regions")
    @classmethod
    def _affinities(cls, regions: tuple[str, ...]) -> tuple[str, ...]:
        for region in regions:
            if not re.fullmatch(REGION_AFFINITY, region):
                raise ValueError(f"{region!r} is not a region affinity")
        return regions


@lru_cache(maxsize=1)
def sweeper_settings() -> SweeperSettings:
    return SweeperSettings.from_environ()
