"""A project's dependency cache (relevo_agent.caches, docs/caches.md) on the local stack: a real
dependency step, `pip install -r` of the pinned wheels of bench/caches.lock into a workspace
virtualenv, with a cache of `.venv` keyed on the lock file, as two Macs of a region would run it.

    .venv/bin/python bench/caches.py      # ~1 min: the registry is reached for the cold installs

1. Mac A, cold: no entry (a miss), the step creates the virtualenv and installs every wheel, then
   the cache is saved;
2. Mac B, another Mac (its own workspace and content cache): the entry restored, the step finds
   its lock file already installed and does nothing;
3. Mac A again, after its checkout's clean removed `.venv`: restored from its own content cache;
4. Mac B with a changed lock file: its key misses, the restore key restores the older entry (a
   partial hit) and the step installs only what changed.

The step is what a project's stage would run; it installs when the virtualenv's copy of the lock
file differs from the checkout's, as a CI script skips its install on a cache hit.

Targets: restored on another Mac (restore + step) >= 5x faster than cold (miss + step); the same
Mac downloads 0 bytes; a changed lock file misses and the restore key gives a partial hit; the
restored tree's digest is the saved one's. Exits 0 when every target is met, 1 when one is
missed, 2 when the bench failed.
"""

from __future__ import annotations

import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import local_stack, report  # noqa: E402

LOCK = Path(__file__).resolve().parent / "caches.lock"
SPEEDUP_TARGET = 5.0
# The dependency step: the virtualenv made and the lock installed unless `.venv` already holds
# this lock file (pip's own cache off: a fresh Mac has none, and the same-Mac figure is Relevo's).
STEP = (
    'cmp -s requirements.lock .venv/requirements.lock && echo "dependencies restored" || '
    "{ {python} -m venv --without-pip .venv && "
    "{python} -m pip --python .venv/bin/python install --quiet --no-cache-dir -r requirements.lock "
    "&& cp requirements.lock .venv/requirements.lock; }"
)


class Mac:
    """One Mac of the region: its workspace (and content cache beside it) and build user's home."""

    def __init__(self, stack: Any, root: Path, project: str) -> None:
        from relevo_agent.handoff.cache import HandoffCache

        self.stack, self.project = stack, project
        self.workspace, self.home = root / "ws" / project, root / "home"
        self.workspace.mkdir(parents=True)
        self.home.mkdir(parents=True)
        self.content_cache = HandoffCache(root / "ws", None)
        self.lines: list[str] = []

    def stage(self, spec: Any) -> tuple[Any, float]:
        """One stage with the cache, as the agent runs it: restore, the step, save. Returns the
        cache's outcome and the seconds of restore + step (what the cache is there to shorten)."""
        from relevo_agent.caches import CacheContext, restore_caches, save_caches
        from relevo_core.store.stage_attempts import StageRef

        context = CacheContext(
            ref=StageRef(self.stack.table_name, "job_" + secrets.token_hex(12), 0, 1, "bench"),
            stage="deps",
            bucket=self.stack.resources["ArtifactBucket"],
            project=self.project,
            region="eu-west",
            workspace=self.workspace,
            home=self.home,
            facts={"os": "darwin", "arch": "arm64", "macos": "15.2", "xcode_build": "16C5032a"},
            writable=True,
            content_cache=self.content_cache,
            emit=self.lines.append,
            cancel=threading.Event(),
        )
        began = time.perf_counter()
        runs = restore_caches((spec,), context)
        step = STEP.replace("{python}", sys.executable)
        done = subprocess.run(step, shell=True, cwd=self.workspace, capture_output=True, text=True)
        seconds = time.perf_counter() - began
        if done.returncode != 0:
            raise RuntimeError(f"the dependency step failed: {done.stdout}{done.stderr}")
        self.lines.append(done.stdout)
        save_caches(runs, context, succeeded=True)
        return runs[0].outcome, seconds


def measure(stack: Any, work: Path) -> tuple[list[str], bool]:
    from relevo_core.models.cache import CacheSpec
    from relevo_core.models.transfer import human_bytes

    spec = CacheSpec(
        name="venv",
        paths=(".venv",),
        key="venv-{os}-{arch}-{hash:requirements.lock}",
        restore_keys=("venv-{os}-{arch}-",),
    )
    project = f"bench-{secrets.token_hex(4)}"
    a, b = Mac(stack, work / "mac-a", project), Mac(stack, work / "mac-b", project)
    for mac in (a, b):
        shutil.copy(LOCK, mac.workspace / "requirements.lock")

    cold, cold_sec = a.stage(spec)
    warm, warm_sec = b.stage(spec)
    shutil.rmtree(a.workspace / ".venv")  # the next checkout's clean
    same, same_sec = a.stage(spec)
    changed = LOCK.read_text().replace("six==1.17.0", "six==1.16.0")
    (b.workspace / "requirements.lock").write_text(changed)
    partial, partial_sec = b.stage(spec)

    speedup = cold_sec / warm_sec
    cold_ok = (cold.restore, cold.save) == ("miss", "saved")
    warm_ok = warm.restore == "hit" and warm.digest == cold.digest and warm.downloaded_bytes > 0
    same_ok = same.restore == "hit" and same.downloaded_bytes == 0 and same.digest == cold.digest
    partial_ok = (partial.restore, partial.restored_key, partial.save) == ("partial", cold.key, "saved")
    ok = cold_ok and warm_ok and speedup >= SPEEDUP_TARGET and same_ok and partial_ok
    lines = [
        f"cold on Mac A: {cold.restore}, pip install of {len(_pins())} wheels in {cold_sec:.2f}s; "
        f"{cold.save} {cold.key}: {human_bytes(cold.saved_bytes)} "
        f"({human_bytes(cold.uploaded_bytes)} uploaded in {cold.save_seconds:.2f}s)",
        f"another Mac (B): {warm.restore} in {warm.restore_seconds:.2f}s, step done in {warm_sec:.2f}s = "
        f"{speedup:.1f}x faster than cold (target >= {SPEEDUP_TARGET:.0f}x); "
        f"{human_bytes(warm.downloaded_bytes)} downloaded; tree digest "
        f"{'equal' if warm.digest == cold.digest else 'DIFFERENT'}",
        f"same Mac (A) after the clean: {same.restore}, {same.downloaded_bytes} bytes downloaded "
        f"(target 0) in {same_sec:.2f}s",
        f"changed lock file on B: {partial.restore} from {partial.restored_key}, the step installed what "
        f"changed in {partial_sec:.2f}s; {partial.save} {partial.key} "
        f"({human_bytes(partial.uploaded_bytes)} uploaded)",
    ]
    report(
        "caches",
        "pip install restored on another Mac",
        speedup,
        f"{speedup:.1f} x faster than cold",
        f">= {SPEEDUP_TARGET:.0f} x",
        warm_ok and speedup >= SPEEDUP_TARGET,
    )
    report(
        "caches",
        "same-Mac restore downloads",
        same.downloaded_bytes,
        f"{same.downloaded_bytes} bytes",
        "0 bytes",
        same_ok,
    )
    report(
        "caches",
        "changed lock file",
        None,
        "miss, partial hit" if partial_ok else f"{partial.restore} ({partial.restored_key})",
        "miss, partial hit",
        partial_ok,
    )
    return lines, ok


def _pins() -> list[str]:
    return [line for line in LOCK.read_text().splitlines() if line and not line.startswith("#")]


def main() -> int:
    began = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="relevo-bench-caches-"))
    try:
        with local_stack(work / "stack", note=f"; work dir {work}") as info:
            lines, ok = measure(info, work)
    except Exception as exc:
        traceback.print_exc()
        print(f"bench error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("\n".join(lines) + ("" if ok else "   << target missed"))
    print(f"total {time.perf_counter() - began:.1f}s; {0 if ok else 1} target(s) missed")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
