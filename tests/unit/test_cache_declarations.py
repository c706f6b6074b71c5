"""A project's `caches:` at `relevo project apply`: bad input refused in one line naming the file,
the line and the field (exit 2), before anything is sent; good input frozen into each stage's plan
that names it, and whether a job's ref writes the caches."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from relevo_cli.main import app
from relevo_core.models.cache import MAX_KEY_TEMPLATE_CHARS, ref_may_write, render_key
from relevo_core.models.project import Project
from tests.helpers.stack_files import unreachable_stack_file

runner = CliRunner()

PROJECT = """\
id: hello
repo: acme/hello
region_affinity: eu-west
caches:
  - name: deps
    paths: [{path}]
    key: "{key}"
stages:
  - name: build
    run: make
    cache: [deps]
"""


def _apply(tmp_path: Path, path: str = ".venv", key: str = "deps-{{hash:requirements.txt}}"):
    project = tmp_path / "hello.yaml"
    project.write_text(PROJECT.format(path=path, key=key))
    stack = str(unreachable_stack_file(tmp_path))
    return project, runner.invoke(app, ["project", "apply", str(project), "--stack-file", stack])


def _one_line(result) -> str:
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert "Traceback" not in result.output, result.output
    assert len(lines) == 1, result.output
    return lines[0]


@pytest.mark.parametrize(
    "path, key, line, field, why",
    [
        ("../elsewhere", "deps", 6, "caches[0].paths.0", "climbs out with '..'"),
        ("/opt/homebrew", "deps", 6, "caches[0].paths", "is absolute"),
        ("~other/Library", "deps", 6, "caches[0].paths", "only the build user's own home"),
        (".venv", "deps-{{xcode_bulid}}", 7, "caches[0].key", "neither a fact the agent knows"),
        (".venv", "deps-{{hash:../requirements.txt}}", 7, "caches[0].key", "whose file pattern climbs out"),
        (".venv", "deps-{{hash:/etc/hosts}}", 7, "caches[0].key", "whose file pattern is absolute"),
        (
            ".venv",
            "x" * (MAX_KEY_TEMPLATE_CHARS + 1),
            7,
            "caches[0].key",
            f"more than {MAX_KEY_TEMPLATE_CHARS}",
        ),
        (".venv", "deps-{{arch", 7, "caches[0].key", "opens or closes no"),
    ],
)
def test_a_bad_cache_is_refused_in_one_line_naming_the_file_line_and_field(
    tmp_path: Path, path: str, key: str, line: int, field: str, why: str
):
    # Given a project file whose cache reaches outside the workspace and home, or whose key names
    # an unknown fact, an escaping file pattern, or is too long
    # When it is applied
    project, result = _apply(tmp_path, path, key)

    # Then it is refused before anything is sent, in one line: file, line, field, why (exit 2)
    assert result.exit_code == 2, result.output
    refused = _one_line(result)
    assert refused.startswith(f"{project}:{line}: {field.split('.')[0]}"), refused
    assert why in refused, refused


def test_a_stage_naming_an_unknown_cache_is_refused(tmp_path: Path):
    project = tmp_path / "hello.yaml"
    project.write_text(PROJECT.format(path=".venv", key="deps").replace("cache: [deps]", "cache: [pods]"))
    stack = str(unreachable_stack_file(tmp_path))
    result = runner.invoke(app, ["project", "apply", str(project), "--stack-file", stack])
    assert result.exit_code == 2, result.output
    assert "stage build: cache pods is not one of the project's caches (deps)" in _one_line(result)


def test_good_caches_are_frozen_into_the_stages_that_name_them():
    # Given a project with a dependency cache under the workspace and the home
    project = Project.model_validate(
        {
            "id": "hello",
            "repo": "acme/hello",
            "region_affinity": "eu-west",
            "caches": [
                {
                    "name": "spm",
                    "paths": [".build", "~/Library/Caches/org.swift.swiftpm"],
                    "key": "spm-{xcode_build}-{arch}-{workspace}-{hash:Package.resolved}",
                    "restore_keys": ["spm-{xcode_build}-{arch}-"],
                    "save": "always",
                }
            ],
            "stages": [{"name": "build", "run": "make", "cache": ["spm"]}, {"name": "test", "run": "make"}],
        }
    )
    # Then the stage that names it carries the whole declaration, the other none
    build, test = project.frozen_stages()
    assert [cache.name for cache in build.caches] == ["spm"] and build.caches[0].save == "always"
    assert test.caches == ()


def test_a_key_renders_the_macs_facts_and_the_files_hash():
    facts = {"xcode_build": "16C5032a", "arch": "arm64", "workspace": "/Users/ci/ws/hello", "sdk": None}
    key = render_key(
        "spm-{xcode_build}-{arch}-{sdk}-{workspace}-{hash:Package.resolved}", facts, lambda p: "f00d"
    )
    assert key.startswith("spm-16C5032a-arm64-none-") and key.endswith("-f00d")
    # the workspace is in the key as a hash: another checkout path is another key
    other = render_key("{workspace}", {**facts, "workspace": "/Users/ci/ws2/hello"}, lambda p: "")
    assert other != render_key("{workspace}", facts, lambda p: "") and len(other) == 16


@pytest.mark.parametrize(
    "ref, write_refs, writes",
    [
        ("main", (), True),
        ("refs/heads/main", (), True),
        ("refs/heads/feature", (), False),
        ("refs/pull/12/head", (), False),
        ("refs/pull/12/head", ("*",), False),  # a pull request's job never writes
        ("refs/heads/release/1.2", ("release/*",), True),
        ("refs/heads/main", ("release/*",), False),
    ],
)
def test_only_a_trusted_refs_job_writes_the_caches(ref: str, write_refs: tuple[str, ...], writes: bool):
    assert ref_may_write(ref, "main", write_refs) is writes
