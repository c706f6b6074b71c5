"""What this Mac can run, detected at the agent's start and put in its presence record: macOS
version (`sw_vers -productVersion`), the selected Xcode (`xcode-select -p`, then its
`xcodebuild -version`), the Xcodes in /Applications (each bundle's version.plist), the CPU
architecture and the free disk under the workspace root; the TOML's `labels` on top. On a host
that is not macOS the probes find no command and it reports what it can (os, arch, free disk,
labels).

Every command goes through `run` (injectable): tests feed it recorded outputs.
"""

from __future__ import annotations

import logging
import platform
import plistlib
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from relevo_core.models.capabilities import Capabilities

log = logging.getLogger(__name__)

# A command's stdout, or None when it cannot run or fails.
Runner = Callable[[list[str]], "str | None"]
COMMAND_TIMEOUT_SEC = 10
_XCODE_VERSION = re.compile(r"^Xcode\s+(\S+)", re.MULTILINE)
_XCODE_BUILD = re.compile(r"^Build version\s+(\S+)", re.MULTILINE)
_ARCH = {"aarch64": "arm64", "arm64": "arm64", "x86_64": "x86_64", "amd64": "x86_64"}


def run_command(argv: list[str]) -> str | None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_SEC, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def free_disk_gb(path: Path) -> float | None:
    """Free space of the file system that holds `path` (or its nearest existing parent)."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            return round(shutil.disk_usage(candidate).free / 1e9, 1)
    return None


def _bundle_version(app: Path) -> str | None:
    try:
        with open(app / "Contents" / "version.plist", "rb") as handle:
            return str(plistlib.load(handle).get("CFBundleShortVersionString")) or None
    except (OSError, plistlib.InvalidFileException, ValueError):
        return None


def detect(
    workspace_root: Path,
    labels: dict[str, str],
    run: Runner = run_command,
    system: str | None = None,
    machine: str | None = None,
    applications: Path = Path("/Applications"),
    disk: Callable[[Path], float | None] = free_disk_gb,
) -> Capabilities:
    system = (system or platform.system()).lower()
    machine = machine or platform.machine()
    arch = _ARCH.get(machine.lower(), machine.lower())
    # Each probe answers where its command exists (macOS); elsewhere it finds nothing.
    macos = (run(["sw_vers", "-productVersion"]) or "").strip() or None
    xcode_path = (run(["xcode-select", "-p"]) or "").strip() or None
    version_text = (run(["xcodebuild", "-version"]) or "") if xcode_path else ""
    found = _XCODE_VERSION.search(version_text)
    xcode = found.group(1) if found else None
    build = _XCODE_BUILD.search(version_text)
    sdk = (run(["xcrun", "--show-sdk-version"]) or "").strip() or None if xcode_path else None
    versions: list[str] = []
    if applications.is_dir():
        versions = sorted({v for app in applications.glob("Xcode*.app") if (v := _bundle_version(app))})
    capabilities = Capabilities(
        os=system,
        arch=arch,
        macos=macos,
        xcode=xcode,
        xcode_build=build.group(1) if build else None,
        sdk=sdk,
        xcode_path=xcode_path,
        xcode_versions=tuple(versions),
        free_disk_gb=disk(workspace_root),
        labels=dict(labels),
    )
    log.info("capabilities: %s", capabilities.facts())
    return capabilities
