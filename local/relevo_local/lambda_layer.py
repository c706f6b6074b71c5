"""The artifacts Lambda runs, built the way `sam build` builds them, for the local stack.

`sam build` (BuildMethod python3.12) turns a layer's ContentUri into `python/`: the directory's
own files plus `pip install -r requirements.txt` for the runtime's Python. Lambda then puts
`/opt/python` on sys.path beside the function's code and the runtime's own boto3, and nothing
else: whatever the layer forgot is a ModuleNotFoundError at cold start. The local stack builds
the same tree (deps installed for the host platform, under the runtime's Python when this
machine has one) and runs every function against it, so a missing dependency fails here.

Installed dependencies are cached per requirements file and interpreter (they do not change
between stacks); the layer's own code is copied fresh for every stack.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

# The packages the Lambda Python runtime ships (boto3 and what it needs).
RUNTIME_PACKAGES = ("boto3", "botocore", "s3transfer", "jmespath", "python-dateutil", "six", "urllib3")
LAMBDA_PYTHON_ENV = "RELEVO_LAMBDA_PYTHON"
_SKIPPED = {"__pycache__", ".pytest_cache"}


class LayerBuildError(RuntimeError):
    """The layer (or the runtime's packages) could not be installed."""


@dataclass(frozen=True)
class LambdaPython:
    """The interpreter that plays the Lambda runtime's Python."""

    executable: Path
    version: tuple[int, int]
    # True when it is the runtime's own version (python3.12 for runtime python3.12).
    matches_runtime: bool

    @property
    def tag(self) -> str:
        return f"{self.version[0]}.{self.version[1]}"


def _version_of(executable: Path) -> tuple[int, int] | None:
    """The interpreter's version, or None when it does not run (a pyenv shim of a version that is
    not the global one exits non-zero)."""
    try:
        out = subprocess.run(
            [str(executable), "-I", "-S", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.fullmatch(r"(\d+)\.(\d+)\s*", out.stdout)
    return (int(match.group(1)), int(match.group(2))) if out.returncode == 0 and match else None


def _pyenv_candidates(version: str) -> list[Path]:
    root = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")
    found = sorted((root / "versions").glob(f"{version}.*/bin/python{version}"), reverse=True)
    return [path for path in found if path.is_file()]


def find_lambda_python(runtime: str) -> LambdaPython:
    """The runtime's Python (`python3.12` for runtime `python3.12`): RELEVO_LAMBDA_PYTHON if set,
    else `python3.12` on PATH, else pyenv's (by path: its shims fail for versions that are not
    global), else this interpreter, marked as not matching."""
    wanted = runtime.removeprefix("python")
    major, minor = (int(part) for part in wanted.split("."))
    candidates: list[Path] = []
    if os.environ.get(LAMBDA_PYTHON_ENV):
        candidates.append(Path(os.environ[LAMBDA_PYTHON_ENV]))
    on_path = shutil.which(f"python{wanted}")
    if on_path:
        candidates.append(Path(on_path))
    candidates += _pyenv_candidates(wanted)
    for candidate in candidates:
        if _version_of(candidate) == (major, minor):
            return LambdaPython(candidate, (major, minor), True)
    if os.environ.get(LAMBDA_PYTHON_ENV):
        raise LayerBuildError(
            f"{LAMBDA_PYTHON_ENV}={os.environ[LAMBDA_PYTHON_ENV]} is not a working Python {wanted}"
        )
    return LambdaPython(Path(sys.executable), sys.version_info[:2], False)


def cache_root() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "relevo" / "lambda"


def _installer(python: LambdaPython, target: Path, requirements: list[str]) -> list[str]:
    """uv when this environment has it (as the Makefile installs it), else the runtime Python's pip."""
    uv = Path(sys.executable).parent / "uv"
    uv_path = str(uv) if uv.is_file() else shutil.which("uv")
    if uv_path:
        return [
            uv_path,
            "pip",
            "install",
            "--quiet",
            "--compile-bytecode",
            "--target",
            str(target),
            "--python",
            str(python.executable),
            *requirements,
        ]
    return [str(python.executable), "-m", "pip", "install", "--quiet", "--target", str(target), *requirements]


def _cached_install(python: LambdaPython, name: str, requirements: list[str]) -> Path:
    """Install `requirements` into a cache directory named by their hash and the interpreter;
    built once (under a file lock, so parallel test workers build it once) and reused."""
    key = hashlib.sha256(
        json.dumps([python.tag, sys.platform, os.uname().machine, requirements]).encode()
    ).hexdigest()[:16]
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{name}-py{python.tag}-{key}"
    if (final / ".complete").is_file():
        return final
    with open(root / f".{final.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / ".complete").is_file():
            return final
        work = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=root))
        result = subprocess.run(_installer(python, work, requirements), capture_output=True, text=True)
        if result.returncode != 0:
            shutil.rmtree(work, ignore_errors=True)
            raise LayerBuildError(
                f"installing {name} for Python {python.tag} failed:\n{result.stderr[-4000:]}"
            )
        (work / ".complete").write_text("\n".join(requirements) + "\n")
        shutil.rmtree(final, ignore_errors=True)
        work.rename(final)
    return final


def requirement_lines(requirements_file: Path) -> list[str]:
    lines = []
    for raw in requirements_file.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            lines.append(line)
    return lines


def _copy_source(source: Path, destination: Path) -> list[Path]:
    """The layer's own files copied into `destination`; the Python packages and modules copied."""
    copied = []
    for entry in sorted(source.iterdir()):
        if entry.name in _SKIPPED or entry.name.endswith(".egg-info"):
            continue
        if entry.is_dir():
            shutil.copytree(
                entry,
                destination / entry.name,
                ignore=shutil.ignore_patterns(*_SKIPPED, "*.egg-info", "*.pyc"),
            )
            if (entry / "__init__.py").is_file():
                copied.append(destination / entry.name)
        else:
            shutil.copy2(entry, destination / entry.name)
            if entry.suffix == ".py":
                copied.append(destination / entry.name)
    return copied


def build_layer(content_dir: Path, python: LambdaPython, out_dir: Path) -> Path:
    """`sam build` of one python layer into `out_dir`; returns the directory Lambda would put on
    sys.path (`out_dir/python`, i.e. /opt/python). Installed packages are hard links into the
    cache (new files the interpreter writes, such as bytecode, stay in `out_dir`)."""
    requirements_file = content_dir / "requirements.txt"
    requirements = requirement_lines(requirements_file) if requirements_file.is_file() else []
    python_dir = out_dir / "python"
    shutil.rmtree(out_dir, ignore_errors=True)
    if requirements:
        deps = _cached_install(python, "layer", requirements)
        shutil.copytree(deps, python_dir, copy_function=os.link, ignore=shutil.ignore_patterns(".complete"))
    else:
        python_dir.mkdir(parents=True)
    copied = _copy_source(content_dir, python_dir)
    # The layer's own modules compiled once here, as the packages in the cache are: otherwise
    # every function's first environment compiles them at its cold start, all at once.
    if not copied:
        return python_dir
    compiled = subprocess.run(
        [str(python.executable), "-I", "-m", "compileall", "-q", "-j", "0", *map(str, copied)],
        capture_output=True,
        text=True,
    )
    if compiled.returncode != 0:
        raise LayerBuildError(
            f"compiling {content_dir.name} for Python {python.tag} "
            f"failed:\n{(compiled.stdout + compiled.stderr)[-4000:]}"
        )
    return python_dir


def runtime_packages(python: LambdaPython) -> Path:
    """The boto3 the Lambda runtime ships, at the versions this environment pins (the runtime's
    own versions move with AWS's updates; the layer pins its own, see layers/core/requirements.txt)."""
    pins = []
    for name in RUNTIME_PACKAGES:
        try:
            pins.append(f"{name}=={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            pins.append(name)
    return _cached_install(python, "runtime", pins)
