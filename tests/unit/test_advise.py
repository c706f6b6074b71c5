"""`relevo advise` (issue 20): the four rows of the decision table (team size x cadence, and
compliance or tenancy), each pinned by what it recommends and the samconfig.toml parameters it
writes; the project file it writes loads as a project file; docs/advise.md is the table rendered."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from relevo_cli.advise import DOCS_PAGE, load_table, render_docs
from relevo_cli.main import app
from relevo_cli.project_file import load_project_file

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def _template_parameters() -> set[str]:
    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("!", lambda loader, suffix, node: None)
    return set(yaml.load((ROOT / "template.yaml").read_text(), Loader=Loader)["Parameters"])


ROWS = [
    (
        [
            "--team-size",
            "5",
            "--cadence",
            "several-a-week",
            "--regions",
            "eu-west",
            "--no-compliance",
            "--tenants",
            "1",
        ],
        "Recommended: A small team shipping several times a week - one project per app",
        "Interactive and CI accounts kept apart",
        {
            "default": 'RegionAffinities="eu-west" QueueLimit=20 JobRetentionDays=30 LogRetentionDays=14 '
            "ArtifactRetentionDays=30"
        },
    ),
    (
        [
            "--team-size",
            "12",
            "--cadence",
            "daily",
            "--regions",
            "eu-west,us-east",
            "--no-compliance",
            "--tenants",
            "1",
        ],
        "Recommended: 9 to 30 people on a daily trunk - a central job store with stage-level retry and "
        "region affinity",
        "Stage-level retry",
        {
            "default": 'RegionAffinities="eu-west,us-east" QueueLimit=100 JobRetentionDays=30 '
            "LogRetentionDays=30 "
            "ArtifactRetentionDays=30 WorkQueueAgeAlarmSeconds=900"
        },
    ),
    (
        [
            "--team-size",
            "45",
            "--cadence",
            "daily",
            "--regions",
            "eu-west",
            "--no-compliance",
            "--tenants",
            "1",
        ],
        "Recommended: More than 30 people with parallel release branches - more region affinities, stricter "
        "DLQ governance",
        "You named one region (eu-west): give each Mac pool a region affinity of its own.",
        {
            "default": 'RegionAffinities="eu-west" QueueLimit=200 JobRetentionDays=60 LogRetentionDays=30 '
            'ArtifactRetentionDays=60 WorkQueueAgeAlarmSeconds=300 ReservedConcurrency="on"'
        },
    ),
    (
        [
            "--team-size",
            "12",
            "--cadence",
            "weekly",
            "--regions",
            "eu-west",
            "--no-compliance",
            "--tenants",
            "2",
        ],
        "Recommended: Compliance or several tenants - a stack per tenant",
        "Cost: Every tenant pays for a whole stack",
        {
            f"tenant-{n}": 'RegionAffinities="eu-west" ReservedConcurrency="on" ApiAccessLogging="on" '
            "JobRetentionDays=90 "
            "LogRetentionDays=90 ArtifactRetentionDays=90"
            for n in (1, 2)
        },
    ),
]


@pytest.mark.parametrize(
    "args, first_line, says, overrides", ROWS, ids=["small", "daily-trunk", "parallel", "tenants"]
)
def test_each_row_of_the_table(tmp_path: Path, args, first_line, says, overrides):
    result = runner.invoke(app, ["advise", *args, "--out", str(tmp_path / "setup")])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[0] == first_line
    assert says in result.output
    config = tomllib.loads((tmp_path / "setup" / "samconfig.toml").read_text())
    written = {
        env: config[env]["deploy"]["parameters"]["parameter_overrides"] for env in config if env != "version"
    }
    assert written == overrides
    names = {part.split("=")[0] for value in written.values() for part in value.split(" ")}
    assert names <= _template_parameters()
    loaded = load_project_file(tmp_path / "setup" / "project.yaml")
    assert loaded.project.region_affinity == args[args.index("--regions") + 1].split(",")[0]


GOLDEN = Path(__file__).parent / "fixtures" / "advise"


@pytest.mark.parametrize(
    "args, _first, _says, _overrides", ROWS, ids=["small", "daily-trunk", "parallel", "tenants"]
)
def test_the_whole_answer_of_each_row_is_pinned(tmp_path: Path, request, args, _first, _says, _overrides):
    """The whole of what `relevo advise` prints for each row, and the files it writes, against
    tests/unit/fixtures/advise/ (RELEVO_UPDATE_GOLDEN=1 rewrites them after a deliberate change)."""
    out = tmp_path / "setup"
    result = runner.invoke(app, ["advise", *args, "--out", str(out)], terminal_width=120)
    assert result.exit_code == 0, result.output
    row = request.node.callspec.id
    answer = {
        f"{row}.txt": result.output.replace(str(out), "<out>"),
        f"{row}.samconfig.toml": (out / "samconfig.toml").read_text(),
        f"{row}.project.yaml": (out / "project.yaml").read_text(),
    }
    for name, text in answer.items():
        pinned = GOLDEN / name
        if os.environ.get("RELEVO_UPDATE_GOLDEN") == "1":
            pinned.parent.mkdir(parents=True, exist_ok=True)
            pinned.write_text(text)
        assert text == pinned.read_text(), f"{name} differs from its pinned copy"


def test_every_row_keeps_artifacts_at_least_as_long_as_job_records():
    """template.yaml: keep ArtifactRetentionDays at least JobRetentionDays, or artifact records
    outlive their objects. The advisor must not write a setup the template warns against."""
    for row in load_table().rows:
        parameters = row.parameters
        if "ArtifactRetentionDays" in parameters or "JobRetentionDays" in parameters:
            assert int(parameters.get("ArtifactRetentionDays", 30)) >= int(
                parameters.get("JobRetentionDays", 30)
            ), row.id


def test_compliance_alone_gives_a_stack_of_its_own(tmp_path: Path):
    result = runner.invoke(
        app,
        [
            "advise",
            "--team-size",
            "3",
            "--cadence",
            "weekly",
            "--regions",
            "eu-west",
            "--compliance",
            "--tenants",
            "1",
            "--out",
            str(tmp_path),
        ],
    )
    assert result.exit_code == 0 and "a stack per tenant" in result.output.splitlines()[0]
    assert (
        tomllib.loads((tmp_path / "samconfig.toml").read_text())["compliance"]["global"]["parameters"][
            "stack_name"
        ]
        == "relevo-compliance"
    )


def test_it_asks_when_not_told(tmp_path: Path):
    result = runner.invoke(app, ["advise", "--out", str(tmp_path)], input="6\nweekly\neu-west\nn\n1\n")
    assert result.exit_code == 0, result.output
    assert "Recommended: A small team shipping several times a week" in result.output


@pytest.mark.parametrize(
    "args, message",
    [
        (["--cadence", "hourly"], "--cadence 'hourly': one of weekly, several-a-week, daily, continuous"),
        (["--regions", "EU West"], "--regions 'EU West'"),
        (["--team-size", "0"], "--team-size"),
    ],
)
def test_bad_answers_are_one_line_and_exit_2(tmp_path: Path, args, message):
    base = {"--team-size": "5", "--cadence": "weekly", "--regions": "eu-west"}
    base.update(dict(zip(args[::2], args[1::2], strict=True)))
    flags = [item for pair in base.items() for item in pair] + [
        "--no-compliance",
        "--tenants",
        "1",
        "--out",
        str(tmp_path / "o"),
    ]
    result = runner.invoke(app, ["advise", *flags])
    assert result.exit_code == 2 and message in result.output, result.output
    assert not (tmp_path / "o").exists()


def test_existing_files_are_not_overwritten_without_force(tmp_path: Path):
    flags = [
        "advise",
        "--team-size",
        "5",
        "--cadence",
        "weekly",
        "--regions",
        "eu-west",
        "--no-compliance",
        "--tenants",
        "1",
        "--out",
        str(tmp_path),
    ]
    (tmp_path / "samconfig.toml").write_text("mine")
    assert runner.invoke(app, flags).exit_code == 2
    assert (tmp_path / "samconfig.toml").read_text() == "mine"
    assert runner.invoke(app, [*flags, "--force"]).exit_code == 0


def test_the_docs_page_is_the_table_rendered():
    assert DOCS_PAGE.read_text() == render_docs(load_table())
