"""How many xdist workers the suite starts (loaded with `-p tests.helpers.xdist_workers` from
pyproject's addopts: a conftest holds fixtures only). PYTEST_XDIST_AUTO_NUM_WORKERS overrides it."""

from __future__ import annotations

import os

import pytest


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


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    # At the end, where CI's log is read (addopts' -q leaves out the header).
    cpus, how = _cpus_granted()
    workers = getattr(config.option, "numprocesses", None)
    terminalreporter.write_line(
        f"relevo: {cpus} CPU(s) granted ({how}; os.cpu_count() {os.cpu_count()}), xdist workers: {workers}"
    )
