"""The project files of `make demo` (examples/demo/): valid projects in the demo's regions, whose
stage commands fail and succeed the way the demo's scenarios count on."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from relevo_agent.effects.ipa import read_binary
from relevo_agent.junit import read_junit
from relevo_cli.projects import load_project_file
from relevo_core.models.errors import EX_TEMPFAIL
from relevo_core.models.project import Project
from relevo_core.models.test_results import canonical_test_id
from relevo_core.shard_plans.listing import read_listing
from relevo_local.peer_suite import suite
from relevo_tools.demo import percentile
from relevo_tools.demo_caches import LOCK, wheels
from relevo_tools.demo_harness import FLEET, PROJECTS


def _projects() -> dict[str, Project]:
    projects = {}
    for path in sorted(PROJECTS.glob("*.yaml")):
        declared = load_project_file(path).project
        project = Project.model_validate({**declared.model_dump(), "webhook": {}})
        projects[project.id] = project
    return projects


def _run(command: str, shared: Path, attempt: int = 1, job_id: str = "job_x", stage: str = "build") -> int:
    env = {
        **os.environ,
        "RELEVO_DEMO_DIR": str(shared),
        "RELEVO_ATTEMPT": str(attempt),
        "RELEVO_JOB_ID": job_id,
        "RELEVO_OPERATION_ID": f"{job_id}:{stage}",
        "RELEVO_ARTIFACT_DIR": str(shared),
    }
    return subprocess.run(["bash", "-c", command], env=env, capture_output=True, timeout=10).returncode


def _command(project: Project, stage: str) -> str:
    return next(s.run for s in project.stages if s.name == stage)


def test_the_demo_projects_are_valid_and_run_in_the_demo_regions():
    projects = _projects()

    assert set(projects) == {
        "release-app",
        "flaky-tests",
        "notarize",
        "store-upload",
        "ui-tests",
        "peer-tests",
        "dep-cache",
    }
    assert {p.region_affinity for p in projects.values()} == set(FLEET)
    release = projects["release-app"]
    assert [s.name for s in release.stages] == ["build", "sign", "upload", "notarize", "deploy"]
    assert release.approval.gated_stage([s.name for s in release.stages]) == "deploy"


def test_the_release_and_the_store_upload_send_the_built_in_apple_kinds_with_a_build_number():
    # Given the demo's projects, then release-app uploads and notarizes with the built-in kinds,
    # store-upload uploads with one, and both give their build stage the job's build number
    projects = _projects()
    kinds = {
        (project_id, s.name): s.effect.kind
        for project_id, project in projects.items()
        for s in project.stages
        if s.effect is not None
    }
    assert kinds == {
        ("release-app", "upload"): "app_store_upload",
        ("release-app", "notarize"): "notarization",
        ("store-upload", "upload"): "app_store_upload",
    }
    for project_id in ("release-app", "store-upload"):
        settings = projects[project_id].build_number
        assert settings is not None and settings.stages == ("build",)


def test_the_flaky_stage_fails_transiently_on_its_first_attempt_only(tmp_path: Path):
    command = _command(_projects()["flaky-tests"], "test")

    assert _run(command, tmp_path, attempt=1) == EX_TEMPFAIL
    assert _run(command, tmp_path, attempt=2) == 0


def test_peer_tests_lists_the_peer_s_tests_and_runs_exactly_the_ones_a_shard_is_given(tmp_path: Path):
    # Given peer-tests' stage, a workspace, and the demo's environment
    [test] = _projects()["peer-tests"].stages
    assert test.tests is not None and test.tests.plan is not None and test.tests.plan.command is not None
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    env = {**_stage_env(tmp_path, "out"), "RELEVO_DEMO_PEER_SUITE": str(suite())}

    # When its plan's command lists the tests
    listed = subprocess.run(
        ["bash", "-c", test.tests.plan.command], cwd=workspace, env=env, capture_output=True, check=True
    ).stdout
    planned = read_listing(listed, test.tests.plan.format)

    # Then they are test_more.py's, each once
    assert len(planned) > 500 and all(p.id.startswith("tests.test_more.") for p in planned)
    # less the one whose own check races the thread it checks (the project file says why)
    assert "tests.test_more.CallbackIterTests::test_exception" not in {p.id for p in planned}
    assert "tests.test_more.CallbackIterTests::test_abort" in {p.id for p in planned}
    # And when a shard is given two of them, its report holds exactly those two
    given = tmp_path / "shard.tests"
    given.write_text(f"{planned[0].listed}\n{planned[-1].listed}\n")
    subprocess.run(
        ["bash", "-c", test.run],
        cwd=workspace,
        env={**env, "RELEVO_SHARD_TESTS": str(given)},
        capture_output=True,
        check=True,
        timeout=60,
    )
    ran = read_junit((workspace / "results" / "junit.xml").read_bytes(), "results/junit.xml")
    assert sorted(canonical_test_id(t.suite, t.name) for t in ran.tests) == sorted(
        [planned[0].id, planned[-1].id]
    )


def test_dep_cache_installs_its_lock_offline_then_does_nothing_once_venv_holds_it(tmp_path: Path):
    # Given dep-cache's stage, a checkout holding its lock file, and the demo's wheels
    [step] = {s.run for s in _projects()["dep-cache"].stages}
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    (workspace / "requirements.lock").write_bytes(LOCK.read_bytes())
    env = {**_stage_env(tmp_path, "cold.out"), "RELEVO_DEMO_WHEELS": str(wheels())}

    def run(output: str) -> str:
        done = subprocess.run(
            ["bash", "-c", step],
            cwd=workspace,
            env={**env, "RELEVO_OUTPUT": str(tmp_path / output), "PIP_NO_INDEX": "1"},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    # When it runs on an empty workspace (a miss)
    assert "pip installed 8 pinned wheels" in run("cold.out")

    # Then .venv has the locked packages, and the step said how long it took and its tree
    imported = subprocess.run(
        [str(workspace / ".venv/bin/python"), "-c", "import rich, six; print(rich.__file__)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert imported.startswith(str(workspace / ".venv"))
    cold = _outputs(tmp_path / "cold.out")
    assert float(cold["step_seconds"]) > 0 and len(cold["digest"]) == 64
    # And when it runs again with .venv in place (a hit), it installs nothing: the same tree
    assert "nothing to install" in run("warm.out")
    assert _outputs(tmp_path / "warm.out")["digest"] == cold["digest"]


def test_notarize_fails_for_good_until_the_ticket_exists(tmp_path: Path):
    project = _projects()["notarize"]
    command = _command(project, "notarize")

    assert _run(command, tmp_path) == 1
    assert 1 not in project.retry.transient_exit_codes
    (tmp_path / "notary-ticket").write_text("T-1\n")
    assert _run(command, tmp_path) == 0


def _stage_env(tmp_path: Path, output: str, **variables: str) -> dict[str, str]:
    return {
        **os.environ,
        "RELEVO_DEMO_DIR": str(tmp_path),
        "RELEVO_DEMO_PYTHON": sys.executable,
        "RELEVO_DEMO_TOOLS": str(PROJECTS / "tools"),
        "RELEVO_OUTPUT": str(tmp_path / output),
        "RELEVO_COMMIT": "0" * 40,
        **variables,
    }


def _outputs(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().split())


def _effect(project: Project, stage: str) -> Any:
    return next(s.effect for s in project.stages if s.name == stage)


def test_the_release_builds_an_ipa_the_upload_reads_with_the_jobs_build_number_and_a_zip_to_notarize(
    tmp_path: Path,
):
    # Given release-app's checkout (VERSION, the app's script) and the job's build number 7
    project = _projects()["release-app"]
    workspace = tmp_path / "workspace"
    (workspace / "Sources").mkdir(parents=True)
    (workspace / "VERSION").write_text("1.4.0\n")
    (workspace / "Sources" / "release-app.sh").write_text("#!/bin/sh\necho ReleaseApp\n")

    # When build, then sign run there
    def run(stage: str, output: str, **variables: str) -> None:
        env = _stage_env(tmp_path, output, RELEVO_BUILD_NUMBER="7", **variables)
        done = subprocess.run(
            ["bash", "-c", _command(project, stage)], cwd=workspace, env=env, capture_output=True, timeout=30
        )
        assert done.returncode == 0, done.stderr

    run("build", "build.out")
    built = _outputs(tmp_path / "build.out")
    run(
        "sign", "sign.out", RELEVO_OUT_BUILD_DIGEST=built["digest"], RELEVO_OUT_BUILD_VERSION=built["version"]
    )

    # Then the upload's kind reads the .ipa as version 1.4.0, build 7, the file sign reported
    upload = _effect(project, "upload")
    binary = read_binary(upload, workspace / upload.file)
    assert (binary.version, binary.build, built["build_number"]) == ("1.4.0", "7", "7")
    assert binary.sha256 == _outputs(tmp_path / "sign.out")["ipa_sha256"]
    # and the notarize stage's .zip holds the app, as the notary service takes it
    with zipfile.ZipFile(workspace / _effect(project, "notarize").file) as archive:
        assert "ReleaseApp.app/Info.plist" in archive.namelist()


def test_the_store_upload_builds_an_ipa_the_upload_reads_with_the_jobs_build_number(tmp_path: Path):
    # Given store-upload's build stage and the job's build number 12
    project = _projects()["store-upload"]
    workspace = tmp_path / "workspace"
    workspace.mkdir()

    # When it runs
    done = subprocess.run(
        ["bash", "-c", _command(project, "build")],
        cwd=workspace,
        env=_stage_env(tmp_path, "build.out", RELEVO_BUILD_NUMBER="12"),
        capture_output=True,
        timeout=30,
    )

    # Then the upload's kind reads the .ipa it hands on as build 12
    assert done.returncode == 0, done.stderr
    upload = _effect(project, "upload")
    assert read_binary(upload, workspace / upload.file).build == "12"


def test_the_ui_test_shards_check_builds_products_and_split_the_tests_between_them(tmp_path: Path):
    """build's products restored into each shard (here: the same workspace), checked against
    build's digest; the three shards' slices are the test plan, each test once. A shard given other
    products than build's fails."""
    project = _projects()["ui-tests"]
    [test] = [s for s in project.stages if s.name == "test"]
    assert test.parallel == 3 and project.region_affinity == "ap-south" and len(FLEET["ap-south"]) == 3
    shared, workspace = tmp_path / "shared", tmp_path / "workspace"
    shared.mkdir()
    workspace.mkdir()
    env = {
        **os.environ,
        "RELEVO_DEMO_DIR": str(shared),
        "RELEVO_DEMO_PYTHON": sys.executable,
        "RELEVO_DEMO_TOOLS": str(PROJECTS / "tools"),
        "RELEVO_JOB_ID": "job_x",
        "RELEVO_OUTPUT": str(tmp_path / "build.out"),
    }

    def run(command: str, **variables: str) -> int:
        return subprocess.run(
            ["bash", "-c", command], cwd=workspace, env={**env, **variables}, capture_output=True, timeout=20
        ).returncode

    assert run(_command(project, "build")) == 0
    digest = dict(line.split("=", 1) for line in (tmp_path / "build.out").read_text().split())["digest"]
    (shared / "ui-tests" / "job_x").mkdir(parents=True)
    for shard in range(3):  # every shard started: none waits for the others
        (shared / "ui-tests" / "job_x" / str(shard)).touch()
    for shard in range(3):
        assert (
            run(
                test.run,
                RELEVO_OUT_BUILD_DIGEST=digest,
                RELEVO_SHARD_INDEX=str(shard),
                RELEVO_SHARD_COUNT="3",
                RELEVO_OPERATION_ID=f"job_x:test#shard-{shard}",
            )
            == 0
        )
    runs = [line.split() for line in (shared / "ui-tests.runs").read_text().splitlines()]
    assert [run[0] for run in runs] == [f"job_x:test#shard-{shard}" for shard in range(3)]
    ran = [name for run in runs for name in run[1:]]
    assert (
        sorted(ran) == (workspace / "build" / "Products" / "tests.txt").read_text().split() and len(ran) == 12
    )

    (workspace / "build" / "Products" / "tests.txt").write_text("AppUITests/other\n")
    assert (
        run(
            test.run,
            RELEVO_OUT_BUILD_DIGEST=digest,
            RELEVO_SHARD_INDEX="0",
            RELEVO_SHARD_COUNT="3",
            RELEVO_OPERATION_ID="job_x:test#shard-0",
        )
        != 0
    )


@pytest.mark.parametrize(
    ("values", "share", "expected"),
    [
        ([3.0], 0.5, 3.0),
        ([3.0], 0.95, 3.0),
        ([float(n) for n in range(1, 21)], 0.5, 10.0),
        ([float(n) for n in range(20, 0, -1)], 0.95, 19.0),
    ],
)
def test_percentile_is_nearest_rank(values: list[float], share: float, expected: float):
    assert percentile(values, share) == expected


NUMBERS = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight"}


def test_the_readme_and_the_demo_page_say_the_fleet_the_demo_starts():
    # Given the fleet `make demo` starts (relevo_tools.demo_harness.FLEET)
    regions, agents = len(FLEET), sum(len(ids) for ids in FLEET.values())
    root = PROJECTS.parents[1]

    # Then the README's one line on it, and the demo page's opening, say that fleet
    readme = (root / "README.md").read_text()
    line = next(line for line in readme.splitlines() if line.startswith("make demo"))
    assert f"({NUMBERS[regions]} regions, {NUMBERS[agents]} agents)" in line, line
    page = (root / "docs" / "demo.md").read_text()
    opening = page.split("## The demo", 1)[1].split("\n| scenario", 1)[0]
    assert f"--region-affinities {','.join(FLEET)}" in opening
    assert f"{NUMBERS[agents]} real `relevo-agent`" in opening
    for region, ids in FLEET.items():
        assert all(f"`{agent_id}`" in opening for agent_id in ids), (region, ids)
