"""`sam build`, run the way docs/operations.md tells users to (`make build`), produces what Lambda will run.

What it caught (issue 13, finding 3): without language extensions SAM CLI 1.170 stops on
Fn::ForEach ("'list' object has no attribute 'get'"); `cached = true` once reported "Build
Succeeded" for a layer without pydantic_core; and the layer lacked aws_xray_sdk, which
Powertools' Tracer imports at every cold start (finding 1, fixed in layers/core/requirements.txt).

BuildMethod python3.12 needs a real Python 3.12: python3.12 on PATH if it runs, else pyenv's by
path. The build is skipped only where neither exists; it runs once per session (one worker).
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from relevo_local.template import load_sam_template, sam_functions

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.xdist_group("sam_build"), pytest.mark.timeout(900)]


def _python312() -> str | None:
    """The same search as the Makefile's PYTHON312_BIN, done independently of it."""
    candidates = [shutil.which("python3.12")]
    pyenv = shutil.which("pyenv")
    if pyenv:
        root = subprocess.run([pyenv, "root"], capture_output=True, text=True).stdout.strip()
        candidates += sorted(glob.glob(f"{root}/versions/3.12*/bin/python3.12"))
    for candidate in filter(None, candidates):
        probe = subprocess.run(
            [candidate, "-c", "import sys; sys.exit(sys.version_info[:2] != (3, 12))"], capture_output=True
        )
        if probe.returncode == 0:
            return candidate
    return None


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if _python312() is None:
        pytest.skip(
            "no Python 3.12 on this machine (neither python3.12 on PATH nor pyenv's 3.12): BuildMethod "
            "python3.12 cannot run"
        )
    build_dir = tmp_path_factory.mktemp("sam") / "build"
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "MAKE"))}
    started = time.monotonic()
    result = subprocess.run(
        ["make", "build", f"BUILD_DIR={build_dir}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=850,
        env=environment,
    )
    print(f"make build took {time.monotonic() - started:.1f} s")
    assert result.returncode == 0, (
        f"make build exited {result.returncode}\n--- stdout\n{result.stdout[-4000:]}\n--- "
        f"stderr\n{result.stderr[-4000:]}"
    )
    assert "Build Succeeded" in result.stdout + result.stderr
    return build_dir


def _layer(build: Path) -> Path:
    layer = build / "CoreLayer" / "python"
    assert layer.is_dir(), f"no layer at {layer}: {sorted(p.name for p in build.iterdir())}"
    return layer


def test_the_layer_holds_relevo_core(build: Path) -> None:
    assert (_layer(build) / "relevo_core" / "__init__.py").is_file()
    assert (_layer(build) / "relevo_core" / "observability.py").is_file()


def test_the_layer_holds_aws_xray_sdk_for_powertools_tracer(build: Path) -> None:
    assert (_layer(build) / "aws_xray_sdk" / "__init__.py").is_file(), (
        "aws_xray_sdk is missing from the built layer: every function would fail its cold start "
        "(relevo_core.observability builds Powertools' Tracer)"
    )


def test_the_layer_holds_an_aarch64_cp312_pydantic_core(build: Path) -> None:
    extensions = sorted(p.name for p in (_layer(build) / "pydantic_core").glob("_pydantic_core*.so"))
    assert extensions == ["_pydantic_core.cpython-312-aarch64-linux-gnu.so"], extensions


def test_every_function_dir_holds_its_handler(build: Path) -> None:
    functions = sam_functions(load_sam_template(ROOT / "template.yaml"), ROOT)
    assert len(functions) >= 10
    for function in functions:
        module = function.handler.rsplit(".", 1)[0].replace(".", "/") + ".py"
        assert (build / function.logical_id / module).is_file(), (
            f"{function.logical_id}: no {module} in its built dir"
        )


def test_the_built_template_still_carries_the_language_extensions(build: Path) -> None:
    """CloudFormation expands Fn::ForEach at deploy; the build only resolved its code paths."""
    text = (build / "template.yaml").read_text()
    assert "AWS::LanguageExtensions" in text and "Fn::ForEach::WorkQueues" in text
