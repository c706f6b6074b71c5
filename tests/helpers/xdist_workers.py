"""How many xdist workers the suite starts (loaded with `-p tests.helpers.xdist_workers` from
pyproject's addopts: a conftest holds fixtures only). PYTEST_XDIST_AUTO_NUM_WORKERS overrides it.

At the end of a run of the whole suite (`make test`: no paths, -k or -m), its wall time, outcome
and host go to .relevo/suite-time.json, which `make bench` reads (bench/suite.py), and the
longest xdist groups are named: a group runs on one worker in sequence, so the longest bounds the
run's wall time."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SUITE_TIME_FILE = ROOT / ".relevo" / "suite-time.json"
_STARTED = pytest.StashKey[float]()


def _cpus_granted() -> tuple[int, str]:
    """How many CPUs this process may really use, and how that was read: the CPUs it may run on,
    less a cgroup CPU quota (a container's --cpus): the quota does not show in the affinity, and
    xdist's own `auto` would start one worker (each with a local stack) per CPU of the host."""
    cpus, how = len(os.sched_getaffinity(0)), "CPU affinity"
    for path, parse in (
        (
            "/sys/fs/cgroup/cpu.max",
            lambda text: text.split(),
        ),  # cgroup v2: "<quota> <period>" or "max <period>"
        ("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", None),  # cgroup v1: quota, with the period beside it
    ):
        try:
            if parse is not None:
                quota, period = parse(open(path).read())
            else:
                quota, period = (
                    open(path).read().strip(),
                    open("/sys/fs/cgroup/cpu/cpu.cfs_period_us").read().strip(),
                )
        except (OSError, ValueError):
            continue
        if quota not in ("max", "-1") and int(period) > 0:
            limit = max(1, int(int(quota) / int(period)))
            if limit < cpus:
                cpus, how = limit, f"cgroup CPU quota {path}"
        break
    return cpus, how


@pytest.hookimpl(tryfirst=True)  # before xdist's own (a firstresult hook; this plugin loads first)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """One worker more than the CPUs granted: the suite's tests wait on real timers (leases, queue
    waits, agents' polls) for about two fifths of their time, which left the CPUs a third idle
    with one worker each (2 CPUs: 706 s and 1.24 CPUs busy with 2 workers, 514 s and 1.55 with 3)."""
    return int(os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS") or _cpus_granted()[0] + 1)


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_STARTED] = time.monotonic()


def is_whole_suite(config: pytest.Config, deselected: int) -> bool:
    """A run of every test `make test` runs: the testpaths of pyproject, no -k, -m or deselection."""
    return (
        config.args_source == pytest.Config.ArgsSource.TESTPATHS
        and not config.option.keyword
        and not config.option.markexpr
        and deselected == 0
    )


def group_seconds(reports: list[Any]) -> Counter[str]:
    """Seconds (setup, call and teardown) per xdist group, from the run's reports: under
    `--dist loadgroup` a grouped test's node id ends in "@group"; tests without a group are left out."""
    seconds: Counter[str] = Counter()
    for report in reports:
        nodeid = getattr(report, "nodeid", None) or ""
        if nodeid.rfind("@") > nodeid.rfind("]"):
            seconds[nodeid.rsplit("@", 1)[1]] += getattr(report, "duration", 0.0)
    return seconds


def _commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False).stdout

    commit = git("rev-parse", "--short", "HEAD").strip() or "unknown"
    return commit + (
        " with uncommitted changes" if git("status", "--porcelain", "--untracked-files=no") else ""
    )


def suite_record(
    wall_sec: float, exitstatus: int, counts: dict[str, int], workers: Any, groups: Counter[str]
) -> dict[str, Any]:
    """What bench/suite.py reads: the run's wall time on this host, with what it ran on."""
    cpus, how = _cpus_granted()
    return {
        "wall_sec": round(wall_sec, 1),
        "exit_status": int(exitstatus),
        "counts": counts,
        "workers": workers,
        "cpus": cpus,
        "cpus_how": how,
        "cpu_count": os.cpu_count(),
        "host": platform.node(),
        "commit": _commit(),
        "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "longest_groups": {name: round(sec, 1) for name, sec in groups.most_common(5)},
    }


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    # At the end, where CI's log is read (addopts' -q leaves out the header).
    cpus, how = _cpus_granted()
    workers = getattr(config.option, "numprocesses", None)
    terminalreporter.write_line(
        f"relevo: {cpus} CPU(s) granted ({how}; os.cpu_count() {os.cpu_count()}), xdist workers: {workers}"
    )
    if hasattr(config, "workerinput") or _STARTED not in config.stash:
        return  # a worker: the controller reports the run
    stats = terminalreporter.stats
    groups = group_seconds([report for reports in stats.values() for report in reports])
    if groups:
        terminalreporter.write_line(
            "relevo: longest xdist groups (each on one worker in sequence): "
            + ", ".join(f"{name} {sec:.0f} s" for name, sec in groups.most_common(5))
        )
    if not is_whole_suite(config, len(stats.get("deselected", []))):
        return
    counts = {outcome: len(stats.get(outcome, [])) for outcome in ("passed", "failed", "error", "skipped")}
    record = suite_record(time.monotonic() - config.stash[_STARTED], exitstatus, counts, workers, groups)
    SUITE_TIME_FILE.parent.mkdir(parents=True, exist_ok=True)
    SUITE_TIME_FILE.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    terminalreporter.write_line(
        f"relevo: the whole suite in {record['wall_sec']:.0f} s on {cpus} CPU(s), "
        f"recorded in {SUITE_TIME_FILE.relative_to(ROOT)} for `make bench` (bench/suite.py)"
    )
