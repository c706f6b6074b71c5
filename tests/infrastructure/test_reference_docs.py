"""The reference of the project file and the agent config agrees with the models that read them:
the shipped JSON Schemas and the docs' field tables are what the models generate, every key has a
description, and every project file and YAML snippet of the docs and examples validates."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft202012Validator

from relevo_cli.project_file import ProjectFile
from relevo_cli.reference import ROOT, agent_config_schema, project_file_schema, stale
from relevo_core.models.project_stage import ProjectStage

SCHEMAS = {"project-file": project_file_schema, "agent-config": agent_config_schema}
PROJECT_FILES = sorted((ROOT / "examples").rglob("*.yaml"))
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_the_shipped_schemas_and_field_tables_are_what_the_models_generate():
    assert stale() == [], "stale: run `.venv/bin/python -m relevo_cli.reference`"


def _properties(schema: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for owner in [schema, *schema.get("$defs", {}).values()]:
        for name, prop in owner.get("properties", {}).items():
            yield f"{owner.get('title')}.{name}", prop


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_every_key_is_described(name: str):
    undescribed = [
        key for key, prop in _properties(SCHEMAS[name]()) if not prop.get("description", "").strip()
    ]
    assert undescribed == []


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_the_shipped_schema_is_a_valid_json_schema(name: str):
    Draft202012Validator.check_schema(json.loads((ROOT / "schemas" / f"{name}.schema.json").read_text()))


@pytest.mark.parametrize("path", PROJECT_FILES, ids=[str(p.relative_to(ROOT)) for p in PROJECT_FILES])
def test_each_example_names_the_schema_and_validates_against_it(path: Path):
    first_line = path.read_text().splitlines()[0]
    match = re.fullmatch(r"# yaml-language-server: \$schema=(\S+)", first_line)
    assert match, f"{path} does not start with the yaml-language-server schema line"
    schema_path = (path.parent / match.group(1)).resolve()
    assert schema_path == ROOT / "schemas" / "project-file.schema.json"
    document = yaml.safe_load(path.read_text())
    Draft202012Validator(json.loads(schema_path.read_text())).validate(document)
    ProjectFile.model_validate(document)


def _yaml_blocks(page: Path) -> Iterator[tuple[int, Any]]:
    for match in re.finditer(r"^```yaml\n(.*?)^```", page.read_text(), re.S | re.M):
        yield page.read_text()[: match.start()].count("\n") + 1, yaml.safe_load(match.group(1))


@pytest.mark.parametrize("page", DOCS, ids=[p.name for p in DOCS])
def test_every_project_snippet_of_the_docs_uses_keys_the_model_knows(page: Path):
    # A whole project file validates as one; a snippet showing stages validates stage by stage.
    for _line, snippet in _yaml_blocks(page):
        if not isinstance(snippet, dict):
            continue
        if "id" in snippet and "stages" in snippet:
            ProjectFile.model_validate(snippet)
        elif set(snippet) == {"stages"}:
            for stage in snippet["stages"]:
                ProjectStage.model_validate(stage)


def test_the_docs_spell_the_approval_timeout_as_the_examples_do():
    # The approval gate's section is in docs/jobs.md.
    approval_gate = (ROOT / "docs" / "jobs.md").read_text()
    assert "timeout_minutes" not in approval_gate
    assert "timeout_sec" in approval_gate


def test_relevo_project_schema_and_relevo_agent_schema_print_the_shipped_schemas():
    from typer.testing import CliRunner

    from relevo_agent.cli import app as agent_app
    from relevo_cli.main import app

    runner = CliRunner()
    project = runner.invoke(app, ["project", "schema"])
    agent = runner.invoke(agent_app, ["schema"])

    assert project.exit_code == 0 and agent.exit_code == 0
    assert json.loads(project.output) == json.loads(
        (ROOT / "schemas" / "project-file.schema.json").read_text()
    )
    assert json.loads(agent.output) == json.loads((ROOT / "schemas" / "agent-config.schema.json").read_text())


def test_the_readme_puts_relevo_on_path_once_and_says_what_the_first_hour_needs():
    readme = (ROOT / "README.md").read_text()
    # One way to run the CLI throughout: on PATH after one export, never .venv/bin/relevo here and there.
    assert readme.count('export PATH="$PWD/.venv/bin:$PATH"') == 1
    assert ".venv/bin/relevo" not in readme
    assert "relevo local agent --region" in readme  # how to run an agent against the local stack
    # What a GitHub webhook must send (Triggers, in docs/architecture.md); that the local stack's
    # state is in memory (The local stack, in docs/demo.md).
    assert "content type to `application/json`" in (ROOT / "docs" / "architecture.md").read_text()
    assert "**The state is in memory**" in (ROOT / "docs" / "demo.md").read_text()
