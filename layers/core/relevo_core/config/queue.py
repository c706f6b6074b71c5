"""The queue function's environment."""

# Annotations are evaluated as written (no `from __future__ import annotations`): pydantic would
# otherwise parse and evaluate each one again, at cold start, to build the models.

from functools import lru_cache

from pydantic import Field

from relevo_core.config import AccessSettings


class QueueSettings(AccessSettings):
    """GET /queue: besides the table and the admins, the regions of the fleet (whose agents it shows)."""

    # Comma-separated region affinities (the template's RegionAffinities).
    fleet_regions: str = Field(default="", alias="FLEET_REGIONS", max_length=4096)

    @property
    def regions(self) -> tuple[str, ...]:
        return tuple(r.strip() for r in self.fleet_regions.split(",") if r.strip())


@lru_cache(maxsize=1)
def queue_settings() -> QueueSettings:
    return QueueSettings.from_environ()
