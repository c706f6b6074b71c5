"""The agent sessions function's environment (the claim routes)."""

# Annotations are evaluated as written (no `from __future__ import annotations`): pydantic would
# otherwise parse and evaluate each one again, at cold start, to build the models.

from functools import lru_cache

from pydantic import Field

from relevo_core.config import FleetRegions, TableSettings


class AgentSessionsSettings(TableSettings, FleetRegions):
    """The claim routes: the table, the fleet's regions, and the role a claimed attempt's session
    is a session of (template.yaml JobRole)."""

    job_role_arn: str = Field(alias="JOB_ROLE_ARN", pattern=r"^arn:aws[a-z-]*:iam::\d{12}:role/.+$")


@lru_cache(maxsize=1)
def agent_sessions_settings() -> AgentSessionsSettings:
    return AgentSessionsSettings.from_environ()
