"""What an agent can run (its capabilities, in its presence record) and what a stage needs (its
`requires`, frozen in the plan), and whether they match.

A requirement is `key: glob` (fnmatch, case-sensitive): `xcode` matches the selected Xcode's
version (`xcodebuild -version`), `macos` the macOS version, `arch` the CPU architecture (arm64,
x86_64), `os` the system (darwin, linux); any other key matches the agent's TOML label of that
name. A key the agent does not have is unmet.
"""

# Annotations are evaluated as written (no `from __future__ import annotations`), as in plan.py.

from fnmatch import fnmatchcase
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

REQUIREMENT_KEY = r"^[a-z][a-z0-9_-]{0,31}$"
RequirementKey = Annotated[str, Field(pattern=REQUIREMENT_KEY)]
RequirementValue = Annotated[str, Field(min_length=1, max_length=64)]
Requirements = dict[RequirementKey, RequirementValue]
MAX_REQUIREMENTS = 16
DETECTED = ("os", "macos", "arch", "xcode")


# Built on first use (defer_build): the run plan imports this module for `Requirements` only.
class Capabilities(BaseModel):
    """What an agent detected on its host, and the labels of its TOML on top."""

    model_config = ConfigDict(frozen=True, extra="ignore", defer_build=True)

    os: str
    arch: str
    macos: str | None = None
    # The selected Xcode (xcode-select -p) and its version (xcodebuild -version), and every
    # Xcode found in /Applications.
    xcode: str | None = None
    # The selected Xcode's build number ("Build version" of xcodebuild -version, 16C5032a) and
    # its SDK's version (xcrun --show-sdk-version): what a cache key names (relevo_core.models.cache).
    xcode_build: str | None = None
    sdk: str | None = None
    xcode_path: str | None = None
    xcode_versions: tuple[str, ...] = ()
    free_disk_gb: float | None = None
    labels: dict[str, str] = {}

    def facts(self) -> dict[str, str]:
        detected = {"os": self.os, "arch": self.arch, "macos": self.macos, "xcode": self.xcode}
        # Labels add keys; they never override what was detected.
        return {**self.labels, **{name: value for name, value in detected.items() if value is not None}}


def unmet(requires: dict[str, str], capabilities: Capabilities | None) -> dict[str, str | None]:
    """Each requirement the agent does not meet: key -> what the agent has (None: nothing)."""
    facts = capabilities.facts() if capabilities is not None else {}
    return {
        key: facts.get(key)
        for key, glob in requires.items()
        if key not in facts or not fnmatchcase(facts[key], glob)
    }


def describe(requires: dict[str, str]) -> str:
    return ", ".join(f"{key}: {value}" for key, value in sorted(requires.items()))
