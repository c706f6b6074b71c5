"""`relevo-agent service install|uninstall|status`: the agent as a launchd agent of the logged-in
user (~/Library/LaunchAgents), started at login, restarted whenever it exits (KeepAlive), with
its output in ~/Library/Logs/relevo-agent/. With `--daemon`, for a config with `run_as`: a
LaunchDaemon (/Library/LaunchDaemons, the `system` domain) that runs the agent as root from boot,
without anyone logged in, its output in /Library/Logs/relevo-agent/.

The plist is generated the same way on every OS (tests read it back with plistlib); loading and
unloading it needs `launchctl`, i.e. macOS.
"""

from __future__ import annotations

import os
import plistlib
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

DEFAULT_LABEL = "dev.relevo.agent"
# launchd's own PATH is /usr/bin:/bin:/usr/sbin:/sbin; stage commands need Homebrew and Xcode tools.
SERVICE_PATH = "/opt/homebrew/bin:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
# Passed through from the installing shell when set, so the service finds the same AWS identity.
PASSED_THROUGH = (
    "AWS_PROFILE",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_CONFIG_FILE",
    "AWS_SHARED_CREDENTIALS_FILE",
)
# launchd sends SIGTERM, then SIGKILL after ExitTimeOut: leave running stages time to finish.
EXIT_TIMEOUT_SEC = 300

Runner = Callable[[Sequence[str]], subprocess.CompletedProcess[str]]


def _run(args: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, check=False)


# What a LaunchDaemon's agent creates is readable unless it says otherwise (its private files are
# 0600 by themselves: relevo_core.files.private), so that the build user reaches its workspaces.
DAEMON_UMASK = 0o022


@dataclass(frozen=True)
class ServicePaths:
    home: Path  # the user's home; for a daemon, the system's root (/)
    label: str = DEFAULT_LABEL
    daemon: bool = False

    @property
    def plist(self) -> Path:
        return (
            self.home
            / "Library"
            / ("LaunchDaemons" if self.daemon else "LaunchAgents")
            / f"{self.label}.plist"
        )

    @property
    def domain(self) -> str:
        return "system" if self.daemon else f"gui/{os.getuid()}"

    @property
    def log_dir(self) -> Path:
        return self.home / "Library" / "Logs" / "relevo-agent"


def plist_for(
    config: Path, paths: ServicePaths, python: str = sys.executable, environ: dict[str, str] | None = None
) -> dict:
    environ = dict(os.environ if environ is None else environ)
    env = {"PATH": SERVICE_PATH, "PYTHONUNBUFFERED": "1", "LANG": environ.get("LANG", "en_US.UTF-8")}
    env.update({name: environ[name] for name in PASSED_THROUGH if environ.get(name)})
    daemon = {"Umask": DAEMON_UMASK} if paths.daemon else {}
    return {
        **daemon,
        "Label": paths.label,
        "ProgramArguments": [
            python,
            "-m",
            "relevo_agent.launch",
            "--config",
            str(config.expanduser().resolve()),
        ],
        "RunAtLoad": True,
        "KeepAlive": True,
        "ThrottleInterval": 10,
        "ExitTimeOut": EXIT_TIMEOUT_SEC,
        "ProcessType": "Standard",
        "WorkingDirectory": str(paths.home),
        "EnvironmentVariables": env,
        "StandardOutPath": str(paths.log_dir / "agent.out.log"),
        "StandardErrorPath": str(paths.log_dir / "agent.err.log"),
    }


def launchctl_available() -> bool:
    return sys.platform == "darwin" and shutil.which("launchctl") is not None


def install(config: Path, paths: ServicePaths, load: bool, run: Runner = _run) -> list[str]:
    """Write the plist (replacing an older one) and load it; returns what was done, in words."""
    done = []
    if load and paths.plist.exists():
        run(["launchctl", "bootout", f"{paths.domain}/{paths.label}"])  # an older version, if loaded
    paths.plist.parent.mkdir(parents=True, exist_ok=True)
    paths.log_dir.mkdir(parents=True, exist_ok=True)
    paths.plist.write_bytes(plistlib.dumps(plist_for(config, paths)))
    done.append(f"wrote {paths.plist}")
    if load:
        result = run(["launchctl", "bootstrap", paths.domain, str(paths.plist)])
        if result.returncode != 0:
            raise RuntimeError(f"launchctl bootstrap failed: {(result.stderr or result.stdout).strip()}")
        done.append(f"loaded {paths.label}; logs in {paths.log_dir}")
    return done


def uninstall(paths: ServicePaths, unload: bool, run: Runner = _run) -> list[str]:
    done = []
    if unload:
        result = run(["launchctl", "bootout", f"{paths.domain}/{paths.label}"])
        if result.returncode == 0:
            done.append(f"stopped and unloaded {paths.label}")
    if paths.plist.exists():
        paths.plist.unlink()
        done.append(f"removed {paths.plist}")
    return done or [f"{paths.label} is not installed"]


def status(paths: ServicePaths, query: bool, run: Runner = _run) -> tuple[bool, str]:
    """(running, description)."""
    if not paths.plist.exists():
        return False, f"not installed ({paths.plist} does not exist)"
    if not query:
        return False, f"installed at {paths.plist}; launchctl is not available here to tell whether it runs"
    result = run(["launchctl", "print", f"{paths.domain}/{paths.label}"])
    if result.returncode != 0:
        return False, f"installed at {paths.plist} but not loaded"
    fields = dict(
        line.strip().split(" = ", 1)
        for line in result.stdout.splitlines()
        if " = " in line and line.startswith("\t") and not line.startswith("\t\t")
    )
    state, pid = fields.get("state", "unknown"), fields.get("pid")
    running = state == "running"
    words = f"{paths.label} is {state}" + (f" (pid {pid})" if pid else "")
    if fields.get("last exit code") not in (None, "0", "(never exited)"):
        words += f"; last exit code {fields['last exit code']}"
    return running, words + f"; logs in {paths.log_dir}"
