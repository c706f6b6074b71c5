"""The setup advisor's table (advice.yaml) and what `relevo advise` does with it: pick the row for
a team size, release cadence, regions, compliance and tenancy; write a starting samconfig.toml
parameter set and project file. `python -m relevo_cli.advise` renders docs/advise.md from the
same file, so the docs never drift from what the command says."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

TABLE = Path(__file__).with_name("advice.yaml")
DOCS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "advise.md"
Cadence = Literal["weekly", "several-a-week", "daily", "continuous"]
CADENCES: tuple[str, ...] = ("weekly", "several-a-week", "daily", "continuous")


class When(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    team: tuple[int, int] | None = None
    cadences: tuple[Cadence, ...] | None = None
    compliance_or_tenants: bool = False


class Row(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    title: str
    when: When
    setup: tuple[str, ...]
    reasons: tuple[str, ...]
    cost: str | None = None
    parameters: dict[str, Any]
    project: dict[str, Any]


class Table(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    rows: tuple[Row, ...] = Field(min_length=1)


class Situation(BaseModel):
    """What the advisor is told (flags or answers)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    team_size: int = Field(ge=1, le=100_000)
    cadence: Cadence
    regions: tuple[str, ...] = Field(min_length=1)
    compliance: bool = False
    tenants: int = Field(default=1, ge=1, le=1000)


def load_table(path: Path = TABLE) -> Table:
    return Table.model_validate(yaml.safe_load(path.read_text(encoding="utf-8")))


def pick(table: Table, situation: Situation) -> Row:
    for row in table.rows:
        when = row.when
        if when.compliance_or_tenants:
            if situation.compliance or situation.tenants > 1:
                return row
            continue
        if when.team is not None and not when.team[0] <= situation.team_size <= when.team[1]:
            continue
        if when.cadences is not None and situation.cadence not in when.cadences:
            continue
        return row
    raise ValueError(f"advice.yaml has no row for {situation}")  # the table covers every team size


def _tenant_names(situation: Situation) -> list[str]:
    return (
        [f"tenant-{n}" for n in range(1, situation.tenants + 1)] if situation.tenants > 1 else ["compliance"]
    )


def _override_value(value: Any) -> str:
    return f'\\"{value}\\"' if isinstance(value, str) else str(value)


def samconfig(row: Row, situation: Situation) -> str:
    """A samconfig.toml with one deploy parameter set per stack the row asks for."""
    parameters = {"RegionAffinities": ",".join(situation.regions), **row.parameters}
    overrides = " ".join(f"{name}={_override_value(value)}" for name, value in parameters.items())
    environments = _tenant_names(situation) if row.when.compliance_or_tenants else ["default"]
    lines = [
        f"# Written by `relevo advise` ({row.id}): a starting point; review it before `sam deploy`.",
        "version = 0.1",
    ]
    for environment in environments:
        stack = "relevo" if environment == "default" else f"relevo-{environment}"
        lines += [
            "",
            f"[{environment}.global.parameters]",
            f'stack_name = "{stack}"',
            "language_extensions = true",
            "",
            f"[{environment}.deploy.parameters]",
            'capabilities = "CAPABILITY_IAM CAPABILITY_AUTO_EXPAND"',
            "confirm_changeset = true",
            "resolve_s3 = true",
            f'parameter_overrides = "{overrides}"',
        ]
    return "\n".join(lines) + "\n"


def project_file(row: Row, situation: Situation, project_id: str = "my-app") -> str:
    project = {
        "id": project_id,
        "repo": f"acme/{project_id}",
        "default_ref": "main",
        "region_affinity": situation.regions[0],
        **row.project,
        "stages": [
            {"name": "build", "run": "xcodebuild -scheme App build", "exec_timeout_sec": 3600},
            {
                "name": "sign",
                "run": "xcodebuild -exportArchive -archivePath App.xcarchive -exportPath out",
                "exec_timeout_sec": 1800,
            },
            {"name": "upload", "run": 'cp out/*.ipa "$RELEVO_ARTIFACT_DIR/"', "exec_timeout_sec": 1800},
        ],
    }
    header = (
        "# yaml-language-server: $schema=project.schema.json\n# Written by `relevo advise` "
        f"({row.id}): a starting project file.\n"
    )
    return header + yaml.safe_dump(project, sort_keys=False, width=120)


def advice_text(row: Row, situation: Situation) -> str:
    lines = [f"Recommended: {row.title}", "", "Setup:"]
    lines += [f"  - {item}" for item in row.setup]
    lines += ["", "Why:"]
    lines += [f"  - {item}" for item in row.reasons]
    if len(situation.regions) == 1 and row.id == "parallel-branches":
        lines.append(
            f"  - You named one region ({situation.regions[0]}): give each Mac pool a region affinity of "
            "its own."
        )
    if row.cost:
        lines += ["", f"Cost: {row.cost}"]
        if situation.tenants > 1:
            lines.append(f"  ({situation.tenants} tenants: {situation.tenants} stacks.)")
    return "\n".join(lines) + "\n"


def render_docs(table: Table) -> str:
    lines = [
        "# The setup advisor",
        "",
        "For platform engineers choosing how to set Relevo up: what `relevo advise` recommends for a team",
        "size, release cadence, regions, compliance and tenancy, and why. Generated from",
        "`cli/relevo_cli/advice.yaml` (`python -m relevo_cli.advise`); the command reads the same file.",
        "",
        "```sh",
        "relevo advise --team-size 12 --cadence daily --regions eu-west,us-east --out setup/",
        "```",
        "",
        "Without flags it asks. It prints the recommendation and writes `samconfig.toml` (a deploy",
        "parameter set per stack) and `project.yaml` (a starting project file) to `--out`.",
    ]
    for row in table.rows:
        when = row.when
        if when.compliance_or_tenants:
            condition = "compliance requirements, or more than one tenant"
        else:
            condition = f"team of {when.team[0]}-{when.team[1]}" if when.team else "any team"
            if when.cadences:
                condition += f", cadence {' / '.join(when.cadences)}"
        lines += ["", f"## {row.title}", "", f"When: {condition}.", ""]
        lines += [f"- {item}" for item in row.setup]
        lines += ["", "Why:", ""] + [f"- {item}" for item in row.reasons]
        if row.cost:
            lines += ["", f"Cost: {row.cost}"]
        lines += [
            "",
            "Parameters: " + ", ".join(f"`{name}={value}`" for name, value in row.parameters.items()),
        ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    DOCS_PAGE.write_text(render_docs(load_table()), encoding="utf-8")
    sys.stdout.write(f"wrote {DOCS_PAGE.relative_to(DOCS_PAGE.parents[1])}\n")
