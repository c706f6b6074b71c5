"""An operator install of the CLI (issue 43): relevo-cli and relevo-core with the dependencies they
declare, and nothing else of Relevo (no agent, no emulator, no development tools), runs every
command `relevo --help` lists.

Given a fresh venv (`python -m venv`, no system site packages) into which uv installs, offline from
its cache and pinned by requirements/dev.lock, the cli and core packages with what they declare,
when `relevo --help` and `relevo <command> [<subcommand>] --help` run for every command it lists,
then each exits 0; and every module relevo_cli imports, anywhere in it (inside a command too, where
`--help` would not reach), is installed, or comes with the `local` extra, whose commands say so
when it is missing (`relevo local up`).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "requirements" / "dev.lock"
# uv, pinned by the Makefile, beside the dev venv's python: it installs from its cache, offline.
UV = Path(sys.executable).parent / "uv"

pytestmark = [pytest.mark.timeout(600), pytest.mark.xdist_group("operator-install")]

# Run inside the operator venv: every command `relevo --help` lists, at every depth, as it lists
# them (hidden ones left out), each run as `relevo <command> --help` (the app the `relevo` script
# calls, in this one process: a process each would start boto3 and typer 58 times); for each, its
# exit code, whether it printed its usage line, and the end of what it printed.
_HELP_OF_EVERY_COMMAND = """
import json, typer
from typer import _click as click
from typer.testing import CliRunner
from relevo_cli.main import app

def listed(command, path):
    found = []
    if hasattr(command, "list_commands"):
        context = click.Context(command)
        for name in command.list_commands(context):
            sub = command.get_command(context, name)
            if sub is not None and not sub.hidden:
                found += [path + [name], *listed(sub, path + [name])]
    return found

runner = CliRunner()
shown = []
for command in listed(typer.main.get_command(app), []):
    done = runner.invoke(app, [*command, "--help"], prog_name="relevo")
    shown.append([command, done.exit_code, "Usage: relevo" in done.output, done.output[-2000:]])
print(json.dumps(shown))
"""

# Run inside the operator venv: each absolute import in relevo_cli's modules whose top-level module
# is not installed there.
_MISSING = """
import ast, importlib.util, json, pathlib
package = pathlib.Path(importlib.util.find_spec("relevo_cli").submodule_search_locations[0])
missing = []
for path in sorted(package.rglob("*.py")):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        for name in names:
            if importlib.util.find_spec(name.split(".")[0]) is None:
                missing.append([str(path.relative_to(package.parent)), name])
print(json.dumps(missing))
"""


def _requirements(pyproject: Path, *extras: str) -> list[str]:
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    found = list(project.get("dependencies", []))
    for extra in extras:
        found += project.get("optional-dependencies", {})[extra]
    return found


def _relevo_modules(requirements: list[str]) -> set[str]:
    return {r.replace("-", "_") for r in requirements if r.startswith("relevo-")}


def _with_the_local_extra() -> set[str]:
    """The Relevo packages only the `local` extra brings (relevo-local and what it declares)."""
    extra = _relevo_modules(_requirements(ROOT / "cli" / "pyproject.toml", "local"))
    extra -= _relevo_modules(_requirements(ROOT / "cli" / "pyproject.toml"))
    return extra | (_relevo_modules(_requirements(ROOT / "local" / "pyproject.toml")) - {"relevo_core"})


@pytest.fixture(scope="module")
def operator_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    venv = tmp_path_factory.mktemp("operator") / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    python = venv / "bin" / "python"
    # Bytecode compiled once here: the suite sets PYTHONDONTWRITEBYTECODE, so each `relevo` run
    # would compile boto3 and the rest again.
    command = [
        str(UV),
        "pip",
        "install",
        "--quiet",
        "--compile-bytecode",
        "--python",
        str(python),
        "-c",
        str(LOCK),
        "-e",
        str(ROOT / "layers" / "core"),
        "-e",
        str(ROOT / "cli"),
    ]
    # From uv's cache, which the dev install filled. A registry that serves no wheel metadata of its
    # own (PEP 658) leaves uv fetching it by range requests, which it does not cache for offline
    # use: uv then refuses offline ("needs to be downloaded from a registry"), so it asks the
    # registry (CI reaches the package registries).
    installed = subprocess.run([*command, "--offline"], capture_output=True, text=True, timeout=300)
    if installed.returncode != 0 and "needs to be downloaded from a registry" in installed.stderr:
        installed = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, (
        "relevo-cli and relevo-core, with what they declare, did not install on their own:\n"
        + installed.stderr
    )
    return venv


def _run(venv: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=120, cwd=venv)


def test_the_operator_install_has_no_other_relevo_package(operator_venv: Path) -> None:
    # Given the operator venv, when its distributions are listed
    shown = _run(operator_venv, str(UV), "pip", "list", "--python", str(operator_venv / "bin" / "python"))
    # Then Relevo's are the CLI and the core only
    relevo = sorted(line.split()[0] for line in shown.stdout.splitlines() if line.startswith("relevo-"))
    assert relevo == ["relevo-cli", "relevo-core"], shown.stdout


def test_relevo_help_runs_from_the_script(operator_venv: Path) -> None:
    # Given the `relevo` script of the operator venv, when it shows its help, then it exits 0
    shown = _run(operator_venv, str(operator_venv / "bin" / "relevo"), "--help")
    assert shown.returncode == 0 and "Usage: relevo" in shown.stdout, shown.stderr


def test_every_command_relevo_help_lists_shows_its_help(operator_venv: Path) -> None:
    # Given the commands `relevo --help` lists in the operator venv, at every depth
    # When `relevo <command> --help` runs for each
    shown = _run(operator_venv, str(operator_venv / "bin" / "python"), "-c", _HELP_OF_EVERY_COMMAND)
    assert shown.returncode == 0, shown.stderr
    runs = json.loads(shown.stdout)
    commands = [command for command, *_ in runs]
    assert ["job", "list"] in commands and ["local", "up"] in commands and ["console"] in commands
    # Then each exits 0 with its usage line
    failed = [
        f"relevo {' '.join(command)} --help: exit {code}\n{output}"
        for command, code, usage, output in runs
        if code != 0 or not usage
    ]
    assert failed == [], "\n".join(failed)


def test_every_module_the_cli_imports_is_installed_or_its_extras(operator_venv: Path) -> None:
    # Given every import in relevo_cli's modules, inside functions too
    shown = _run(operator_venv, str(operator_venv / "bin" / "python"), "-c", _MISSING)
    assert shown.returncode == 0, shown.stderr
    # When those the operator venv lacks are read
    missing = json.loads(shown.stdout)
    # Then each is the `local` extra's (relevo local, the deploy preflight's template reader)
    extra = _with_the_local_extra()
    assert extra == {"relevo_local", "relevo_agent"}
    unmet = [f"{module} imports {name}" for module, name in missing if name.split(".")[0] not in extra]
    assert unmet == [], "an operator install cannot run these imports:\n" + "\n".join(unmet)
