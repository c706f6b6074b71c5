"""A project's build numbers (RELEVO_BUILD_NUMBER): which stages need one, and the least it may be.

Annotations are evaluated as written (no `from __future__ import annotations`), as in the other
models: pydantic would otherwise evaluate each one again at cold start."""

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

# Google Play's largest versionCode; Apple's CFBundleVersion takes any such integer too.
MAX_BUILD_NUMBER = 2_100_000_000


class BuildNumberSettings(BaseModel):
    """Frozen into each job (JobEnvelope.build_number) like the stages it names."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    stages: tuple[Annotated[str, Field(pattern=r"^[a-z][a-z0-9_-]{0,62}$")], ...] = Field(
        min_length=1,
        max_length=32,
        description="The stages that need the job's build number: the first of them claimed gives the job "
        "the project's next one (a conditional write, once per job); every stage claimed after that, "
        "listed or not, sees it as RELEVO_BUILD_NUMBER. A stage not listed costs nothing more to claim.",
    )
    floor: int = Field(
        default=1,
        ge=1,
        le=MAX_BUILD_NUMBER,
        description="The least number a job is given: the next is the project's last plus one, or this "
        "when that is lower (e.g. the App Store's latest build number for the app plus one).",
    )
