"""The template and the state machines pass the linters `make lint` runs, and nothing is left to waive."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _run(*command: str | Path, timeout: float) -> None:
    result = subprocess.run(
        [str(part) for part in command],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, (
        f"{' '.join(str(part) for part in command)} exited {result.returncode}\n"
        f"--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
    )


def test_cfn_lint_with_serverless_rules_is_clean() -> None:
    """cfn-lint, with the serverless rules appended, reports nothing for template.yaml."""
    _run(BIN / "cfn-lint", "--append-rules", "cfn_lint_serverless.rules", "--", "template.yaml", timeout=120)


def test_statelint_is_clean() -> None:
    """Every state machine definition is valid Amazon States Language."""
    definitions = sorted((ROOT / "statemachines").glob("*.asl.json"))
    assert ROOT / "statemachines" / "job.asl.json" in definitions
    _run(BIN / "statelint", *definitions, timeout=60)


# `--skip-download` keeps checkov offline (it would fetch guideline mappings); the checks are the same.
CHECKOV = ("--quiet", "--compact", "--skip-download", "--framework", "cloudformation")


@pytest.mark.timeout(300)
def test_checkov_passes_the_template_and_inside_fn_foreach(tmp_path: Path) -> None:
    """checkov passes template.yaml; every skipped check carries its reason in the resource's
    Metadata. checkov does not expand Fn::ForEach, so it never sees the per-region queues and
    alarms: it must pass the expanded template too. One run reads both files (checkov's start
    is most of its time)."""
    from relevo_local.template import load_sam_template

    expanded = load_sam_template(ROOT / "template.yaml")
    assert "WorkQueueeuwest" in expanded["Resources"]
    path = tmp_path / "expanded.json"
    path.write_text(json.dumps(expanded, indent=1))
    _run(BIN / "checkov", *CHECKOV, "-f", "template.yaml", "-f", path, timeout=290)
