"""The queue function's environment."""

# Annotations are evaluated as written (no `from __future__ import annotations`): pydantic would
# otherwise parse and evaluate each one again, at cold start, to build the models.

from functools import lru_cache

from relevo_core.config import AccessSettings, FleetRegions


class QueueSettings(AccessSettings, FleetRegions):
    """GET /queue: besides the table and the admins, the regions of the fleet (whose agents it shows)."""


@lru_cache(maxsize=1)
def queue_settings() -> QueueSettings:
    return QueueSettings.from_environ()
