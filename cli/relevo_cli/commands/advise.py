"""`relevo advise`: the setup advisor (relevo_cli.advise holds its table and what it writes)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import typer
from pydantic import ValidationError

from relevo_cli.advise import CADENCES, Situation, advice_text, load_table, pick, project_file, samconfig
from relevo_cli.cli_errors import UserMistake
from relevo_core.models.envelope import REGION_AFFINITY


def _regions(text: str) -> tuple[str, ...]:
    regions = tuple(part.strip() for part in text.split(",") if part.strip())
    bad = [region for region in regions if not re.match(REGION_AFFINITY, region)]
    if bad or not regions:
        raise UserMistake(
            f"--regions {text!r}: region affinities are lowercase names like eu-west, comma-separated"
        )
    return regions


def advise_command(
    team_size: int | None = typer.Option(None, "--team-size", help="people who build and release"),
    cadence: str | None = typer.Option(
        None, "--cadence", help=f"how often you release: {', '.join(CADENCES)}"
    ),
    regions: str | None = typer.Option(
        None, "--regions", help="region affinities of your Macs, comma-separated (e.g. eu-west,us-east)"
    ),
    compliance: bool | None = typer.Option(
        None, "--compliance/--no-compliance", help="audited isolation required"
    ),
    tenants: int | None = typer.Option(
        None, "--tenants", help="separate customers or business units on one Relevo (1: none)"
    ),
    out: Path = typer.Option(
        Path("relevo-setup"), "--out", help="where samconfig.toml and project.yaml are written"
    ),
    force: bool = typer.Option(False, "--force", help="overwrite files already in --out"),
) -> None:
    """Recommend a Relevo setup for your team (flags, or it asks), and write a starting samconfig.toml and
    project file."""
    if team_size is None:
        team_size = typer.prompt("How many people build and release?", type=int)
    if cadence is None:
        cadence = typer.prompt(f"How often do you release ({', '.join(CADENCES)})?")
    if regions is None:
        regions = typer.prompt("Region affinities of your Macs (comma-separated)", default="eu-west")
    if compliance is None:
        compliance = typer.confirm("Do you need audited isolation (compliance)?", default=False)
    if tenants is None:
        tenants = typer.prompt(
            "How many tenants (separate customers or business units)?", type=int, default=1
        )
    if cadence not in CADENCES:
        raise UserMistake(f"--cadence {cadence!r}: one of {', '.join(CADENCES)}")
    try:
        situation = Situation(
            team_size=team_size,
            cadence=cadence,
            regions=_regions(regions),
            compliance=compliance,
            tenants=tenants,
        )
    except ValidationError as exc:
        raise UserMistake(
            "; ".join(f"--{'-'.join(map(str, e['loc'])).replace('_', '-')}: {e['msg']}" for e in exc.errors())
        ) from None
    row = pick(load_table(), situation)
    files = {
        out / "samconfig.toml": samconfig(row, situation),
        out / "project.yaml": project_file(row, situation),
    }
    existing = [str(path) for path in files if path.exists()]
    if existing and not force:
        raise UserMistake(
            f"{', '.join(existing)} already exist: choose another --out, or --force to overwrite"
        )
    out.mkdir(parents=True, exist_ok=True)
    for path, text in files.items():
        path.write_text(text, encoding="utf-8")
    sys.stdout.write(advice_text(row, situation))
    sys.stdout.write(f"\nWrote {out / 'samconfig.toml'} and {out / 'project.yaml'}.\n")
