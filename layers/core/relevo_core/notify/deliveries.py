"""GET /deliveries: delivery records, outgoing (notify.reporter, notify.channels) and incoming
(intake.webhooks.records), of the projects the caller may view."""

from __future__ import annotations

from typing import Any

from relevo_core.config import AccessSettings
from relevo_core.models.access import Level
from relevo_core.models.delivery import DeliveryRecord
from relevo_core.projects.permissions import require
from relevo_core.projects.registry import visible_projects
from relevo_core.store.deliveries import project_deliveries

LISTED = 200


def list_deliveries(
    settings: AccessSettings, caller: str, project: str | None, failed_only: bool
) -> list[dict[str, Any]]:
    """The delivery records of one project (view), or of every project the caller may view and
    their groups, newest first."""
    if project:
        require(settings, caller, project, Level.VIEW)
        partitions = [project]
    else:
        projects = visible_projects(settings, caller)
        partitions = [p.id for p in projects] + sorted({f"group:{p.group}" for p in projects if p.group})
    records: list[DeliveryRecord] = []
    for partition in partitions:
        records += project_deliveries(settings.table_name, partition, failed_only, LISTED)
    records.sort(key=lambda r: r.at, reverse=True)
    return [r.model_dump(mode="json", exclude_none=True) for r in records[:LISTED]]
