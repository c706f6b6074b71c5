"""The handoff's cost (relevo_agent.handoff) on the local stack: a 1 GiB tree, like an
.xcarchive (thousands of small files, a few large ones, symlinks), stored by agent A and
restored by agent B, against raw boto3 moving the same bytes as one archive in the same run.

    .venv/bin/python bench/handoff.py               # ~3-5 min, ~5 GiB of disk in a temp dir
    .venv/bin/python bench/handoff.py --gib 0.25    # a smaller tree

Each side runs in a process of its own, as an agent would (the stack runs in this one):

1. raw: `upload_file` then `download_file` of the tree as one tar archive (made before the
   clock starts), boto3's default TransferConfig;
2. A: `store_handoff` of the tree (hash, pack, upload, record, fenced on a claimed attempt);
3. B: `restore_handoffs` into an empty workspace (download, verify every byte, place);
4. A again, after the checkout's git clean removed the tree: restore from A's own cache.

Targets: store + restore ≤ 1.25 × raw; each side's peak RSS ≤ 100 MB; the same-Mac restore
downloads 0 bytes. Exits 0 when every target is met, 1 when one is missed, 2 when the bench failed.

While working on it: RELEVO_BENCH_PROFILE=1 prints each side's slowest calls (cProfile) to
stderr; RELEVO_BENCH_ONE_GET_ONLY=1 leaves out the baseline's download_file (minutes on the
emulator, see bench/README.md), so the baseline is the one streamed GET it would choose anyway.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import secrets
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from datetime import UTC

from harness import local_stack, report  # noqa: E402

RATIO_TARGET = 1.25
RSS_TARGET_MB = 100.0
SMALL_FILE_BYTES = 32 * 1024
LARGE_FILES = 3


def make_tree(root: Path, total_bytes: int) -> tuple[int, int]:
    """An .xcarchive-like tree: a quarter of the bytes in small files (dSYM pieces, images, plists
    under nested directories), the rest in LARGE_FILES binaries; frameworks with their links."""
    small_bytes = total_bytes // 4
    large_each = (total_bytes - small_bytes) // LARGE_FILES
    archive = root / "build" / "App.xcarchive"
    products = archive / "Products" / "Applications" / "App.app"
    count = 0
    for index in range(small_bytes // SMALL_FILE_BYTES):
        directory = products / "Assets" / f"set{index // 256:03d}"
        if index % 256 == 0:
            directory.mkdir(parents=True, exist_ok=True)
        (directory / f"image{index:05d}.png").write_bytes(
            index.to_bytes(4, "big") + os.urandom(SMALL_FILE_BYTES - 4)
        )
        count += 1
    for index in range(LARGE_FILES):
        path = archive / "dSYMs" / f"Part{index}.dSYM" / "Contents" / "Resources" / "DWARF" / "App"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as handle:
            for _ in range(large_each // (8 * 1024 * 1024)):
                handle.write(os.urandom(8 * 1024 * 1024))
            handle.write(os.urandom(large_each % (8 * 1024 * 1024)))
        count += 1
    framework = products / "Frameworks" / "Kit.framework" / "Versions" / "A"
    framework.mkdir(parents=True)
    (framework / "Kit").write_bytes(os.urandom(1000))
    (framework / "Kit").chmod(0o755)
    os.symlink("A", framework.parent / "Current")
    os.symlink("Versions/Current/Kit", framework.parent.parent / "Kit")
    (archive / "Info.plist").write_text("<plist/>\n")
    return count + 2, sum(p.stat().st_size for p in archive.rglob("*") if p.is_file() and not p.is_symlink())


def _child(args: list[str]) -> tuple[dict[str, Any], float]:
    """Run one side in a process of its own: (what it printed as JSON, its peak RSS in MB)."""
    done = subprocess.run([sys.executable, __file__, *args], stdout=subprocess.PIPE, env=os.environ.copy())
    if done.returncode != 0:
        raise RuntimeError(
            f"{args[1]} failed (exit {done.returncode}): {done.stdout.decode(errors='replace')[-2000:]}"
        )
    answer = json.loads(done.stdout.decode().strip().splitlines()[-1])
    return answer, answer.pop("peak_rss_mb")


def peak_rss_mb() -> float:
    """This process's own high-water mark since its exec (VmHWM; getrusage's ru_maxrss would count
    the bench's pages the fork copied before the exec)."""
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (
        1024 * 1024 if sys.platform == "darwin" else 1024
    )


# ------------------------------------------------------------------------------------------------
# The sides (run as `bench/handoff.py --side …`)


def side_raw(archive: Path, bucket: str, key: str, into: Path) -> dict[str, Any]:
    from relevo_core.aws import client

    s3 = client("s3")
    began = time.monotonic()
    s3.upload_file(str(archive), bucket, key)
    uploaded = time.monotonic()
    if os.environ.get("RELEVO_BENCH_ONE_GET_ONLY"):  # iterating: the emulator's ranged GETs take minutes
        downloaded = uploaded = time.monotonic()
    else:
        s3.download_file(bucket, key, str(into))
        downloaded = time.monotonic()
    # The same bytes in one GET: the emulator reads a whole object for every ranged GET, so
    # download_file's ranged parts cost it (object size × parts); the faster of the two is the baseline.
    body = s3.get_object(Bucket=bucket, Key=key)["Body"]
    with open(into, "wb") as handle:
        for block in iter(lambda: body.read(1024 * 1024), b""):
            handle.write(block)
    return {
        "upload_sec": uploaded - began,
        "download_file_sec": downloaded - uploaded,
        "one_get_sec": time.monotonic() - downloaded,
    }


def side_store(ref: dict[str, Any], workspace: Path, uri: str, cache_root: Path) -> dict[str, Any]:
    import threading

    from relevo_agent.handoff.cache import HandoffCache
    from relevo_agent.handoff.store import store_handoff
    from relevo_core.store.stage_attempts import StageRef

    began = time.monotonic()
    summary = store_handoff(
        StageRef(**ref),
        "build",
        workspace,
        ("build/App.xcarchive",),
        uri,
        1_900_000_000,
        {},
        HandoffCache(cache_root, None),
        lambda line: None,
        threading.Event(),
    )
    return {"seconds": time.monotonic() - began, "summary": summary.model_dump(mode="json")}


def side_restore(summary: dict[str, Any], job_id: str, workspace: Path, cache_root: Path) -> dict[str, Any]:
    import threading

    from relevo_agent.handoff.cache import HandoffCache
    from relevo_agent.handoff.restore import Source, restore_handoffs
    from relevo_core.models.handoff import HandoffSummary

    began = time.monotonic()
    result = restore_handoffs(
        [Source("build", job_id, HandoffSummary.model_validate(summary))],
        workspace,
        HandoffCache(cache_root, None),
        lambda line: None,
        threading.Event(),
        job_id,
    )
    return {
        "seconds": time.monotonic() - began,
        "restored_bytes": result.restored_bytes,
        "cached_bytes": result.cached_bytes,
        "present_bytes": result.present_bytes,
        "digest": result.digest,
    }


def run_side(argv: list[str]) -> int:
    from relevo_agent.memory import fewer_arenas

    fewer_arenas()  # as `relevo-agent run` does at its start
    parser = argparse.ArgumentParser()
    parser.add_argument("--side", required=True)
    parser.add_argument("--arg", action="append", default=[])
    args = parser.parse_args(argv)
    values = [json.loads(value) for value in args.arg]
    side = {"raw": side_raw, "store": side_store, "restore": side_restore}[args.side]
    arguments = [Path(v) if isinstance(v, str) and v.startswith("/") else v for v in values]
    if os.environ.get("RELEVO_BENCH_PROFILE"):
        # Where a side's time goes, to stderr: the clock time of its slowest calls.
        import cProfile
        import pstats

        profile = cProfile.Profile()
        answer = profile.runcall(side, *arguments)
        pstats.Stats(profile, stream=sys.stderr).sort_stats("cumulative").print_stats(25)
    else:
        answer = side(*arguments)
    print(json.dumps({**answer, "peak_rss_mb": peak_rss_mb()}))
    return 0


# ------------------------------------------------------------------------------------------------


def measure(stack: Any, work: Path, total_bytes: int) -> tuple[list[str], bool]:
    from datetime import datetime

    from relevo_core.aws import client
    from relevo_core.store import stage_attempts, stage_claims

    near, far = work / "mac-a", work / "mac-b"
    files, size = make_tree(near / "ws", total_bytes)
    archive = work / "tree.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(near / "ws" / "build", arcname="build")
    bucket = stack.resources["ArtifactBucket"]
    job_id = "job_" + secrets.token_hex(12)
    uri = f"s3://{bucket}/bench/{job_id}/"
    ref = stage_attempts.StageRef(stack.table_name, job_id, 0, 1, "mac-a")
    client("dynamodb").put_item(
        TableName=stack.table_name,
        Item={"pk": {"S": f"STAGES#{job_id}"}, "sk": {"S": "STAGE#00"}, "stage_name": {"S": "build"}},
    )
    stage_claims.claim(ref, 3600, datetime.now(UTC))
    ref_fields = {
        "table": ref.table,
        "job_id": ref.job_id,
        "stage_index": 0,
        "attempt": 1,
        "agent_id": "mac-a",
    }

    raw, raw_rss = _child(
        [
            "--side",
            "raw",
            "--arg",
            json.dumps(str(archive)),
            "--arg",
            json.dumps(bucket),
            "--arg",
            json.dumps(f"bench/raw/{job_id}.tar"),
            "--arg",
            json.dumps(str(work / "downloaded.tar")),
        ]
    )
    (work / "downloaded.tar").unlink()
    stored, store_rss = _child(
        [
            "--side",
            "store",
            "--arg",
            json.dumps(ref_fields),
            "--arg",
            json.dumps(str(near / "ws")),
            "--arg",
            json.dumps(uri),
            "--arg",
            json.dumps(str(near)),
        ]
    )
    restored, restore_rss = _child(
        [
            "--side",
            "restore",
            "--arg",
            json.dumps(stored["summary"]),
            "--arg",
            json.dumps(job_id),
            "--arg",
            json.dumps(str(far / "ws")),
            "--arg",
            json.dumps(str(far)),
        ]
    )
    shutil.rmtree(near / "ws" / "build")  # the next stage's checkout: git clean -ffdx
    same_mac, same_rss = _child(
        [
            "--side",
            "restore",
            "--arg",
            json.dumps(stored["summary"]),
            "--arg",
            json.dumps(job_id),
            "--arg",
            json.dumps(str(near / "ws")),
            "--arg",
            json.dumps(str(near)),
        ]
    )

    raw["download_sec"] = min(raw["download_file_sec"] or raw["one_get_sec"], raw["one_get_sec"])
    raw_sec = raw["upload_sec"] + raw["download_sec"]
    handoff_sec = stored["seconds"] + restored["seconds"]
    ratio = handoff_sec / raw_sec
    peak = max(store_rss, restore_rss, same_rss)
    same_ok = same_mac["restored_bytes"] == 0 and same_mac["digest"] == stored["summary"]["digest"]
    exact = restored["digest"] == stored["summary"]["digest"]
    gib = size / 1024**3
    lines = [
        f"tree: {files} files, {gib:.2f} GiB ({size / 1024**2 / max(files, 1):.2f} MiB a file on average)",
        f"raw boto3 (one archive): upload_file {raw['upload_sec']:.1f}s + download "
        f"{raw['download_sec']:.1f}s = {raw_sec:.1f}s "
        f"({size / raw_sec / 1024**2:.0f} MiB/s; download_file {raw['download_file_sec']:.1f}s, one GET "
        f"{raw['one_get_sec']:.1f}s: "
        f"the faster is the baseline); its process peaked at {raw_rss:.0f} MB",
        f"handoff A → B: store {stored['seconds']:.1f}s + restore {restored['seconds']:.1f}s = "
        f"{handoff_sec:.1f}s "
        f"= {ratio:.2f}× raw (target ≤ {RATIO_TARGET}×); tree digest {'equal' if exact else 'DIFFERENT'} on "
        "B",
        f"peak RSS: store {store_rss:.0f} MB, restore {restore_rss:.0f} MB, same-Mac restore {same_rss:.0f} "
        f"MB (target ≤ {RSS_TARGET_MB:.0f} MB)",
        f"same-Mac restore after the clean: {same_mac['restored_bytes']} bytes downloaded (target 0), "
        f"{same_mac['cached_bytes'] / 1024**2:.0f} MiB from the cache in {same_mac['seconds']:.1f}s",
        f"stored {stored['summary']['uploaded_bytes'] / 1024**2:.0f} MiB in {stored['summary']['files']} "
        "files' packs and blobs",
    ]
    report(
        "handoff",
        "store + restore of a 1 GiB tree",
        ratio,
        f"{ratio:.2f} x raw",
        f"<= {RATIO_TARGET} x raw boto3",
        ratio <= RATIO_TARGET,
    )
    report("handoff", "peak RSS", peak, f"{peak:.0f} MB", f"<= {RSS_TARGET_MB:.0f} MB", peak <= RSS_TARGET_MB)
    report(
        "handoff",
        "same-Mac restore downloads",
        same_mac["restored_bytes"],
        f"{same_mac['restored_bytes']} bytes",
        "0 bytes",
        same_ok,
    )
    report("handoff", "tree restored on another Mac", None, "equal" if exact else "DIFFERENT", "equal", exact)
    return lines, ratio <= RATIO_TARGET and peak <= RSS_TARGET_MB and same_ok and exact


def main() -> int:
    if "--side" in sys.argv:
        return run_side(sys.argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gib", type=float, default=1.0)
    args = parser.parse_args()
    began = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="relevo-bench-handoff-"))
    try:
        with local_stack(work / "stack", note=f"; work dir {work}") as info:
            lines, ok = measure(info, work, int(args.gib * 1024**3))
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
    resource.setrlimit(resource.RLIMIT_NOFILE, (4096, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    sys.exit(main())
