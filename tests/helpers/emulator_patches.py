"""What each of the emulator's speed patches (relevo_local.moto) saves the local experience.

    .venv/bin/python -m tests.helpers.emulator_patches                   # every speed patch, ~10 min
    .venv/bin/python -m tests.helpers.emulator_patches --rounds 3 --fill 4000 --only
    query_a_tables_partition_only

Starts the embedded stack once, in this process, with every patch installed, and keeps what each
speed patch changed in moto (its classes' and modules' attributes before and after it ran), so
that it can be switched off and on again between samples. A sample runs `--jobs` jobs of four
stages the way the integration tests do (a signed push through the API, then per stage the
test's agent double: receive, claim, accept, heartbeat, record, report; tests.helpers), and
measures this process's CPU time (the emulator runs here; the functions' runtimes are processes
of their own and call it over HTTP, which the patches do not change) and its wall time. For each
patch, its on and off samples alternate, in turn first, for `--rounds` rounds (the machine is
shared: medians of interleaved samples); one more row switches every speed patch off at once.
`--fill` items in other partitions are written to the table first: a test worker's stack lives
through the whole suite and its table grows by some 20 items a test.

Prints, per patch, the median CPU seconds and wall seconds per job with the patch on and off and
the gain (off less on). Exits 0, or 2 when the bench itself failed. Not a bench (it measures the emulator, not
Relevo; bench/ modules import no test module): its figures are the ones docs/emulator.md quotes for each kept
speed patch.
"""

from __future__ import annotations

import argparse
import importlib
import secrets
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402  (the repository root is on the path first)

STAGES = [
    {"name": "build", "run": "true"},
    {"name": "test", "run": "true"},
    {"name": "sign", "run": "true"},
    {"name": "upload", "run": "true"},
]
# Each speed patch: its module of relevo_local.moto, and the moto objects whose attributes it sets.
SPEED_PATCHES: dict[str, tuple[str, tuple[str, ...]]] = {
    "serialize_attribute_values_directly": ("server", ("moto.core.serialize:BaseJSONSerializer",)),
    "parse_each_state_machine_definition_once": (
        "stepfunctions",
        ("moto.stepfunctions.parser.asl.parse.asl_parser:AmazonStateLanguageParser",),
    ),
    "parse_each_json_path_once": (
        "stepfunctions",
        (
            "moto.stepfunctions.parser.asl.utils.json_path",
            "moto.stepfunctions.parser.asl.component.common.path.result_path",
        ),
    ),
    "query_a_tables_partition_only": ("dynamodb", ("moto.dynamodb.models.table:Table",)),
    "back_up_only_touched_items_in_transactions": (
        "dynamodb",
        ("moto.dynamodb.models", "moto.dynamodb.models:DynamoDBBackend"),
    ),
}
MISSING = object()


def _owner(spec: str) -> Any:
    module, _, name = spec.partition(":")
    found = importlib.import_module(module)
    return getattr(found, name) if name else found


class Switch:
    """What one patch set on moto's objects: (owner, attribute, before, after)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.changes: list[tuple[Any, str, Any, Any]] = []

    def wrap(self) -> None:
        module_name, owners = SPEED_PATCHES[self.name]
        module = importlib.import_module(f"relevo_local.moto.{module_name}")
        patch = getattr(module, self.name)

        def recorded() -> None:
            objects = [_owner(spec) for spec in owners]
            before = [dict(vars(obj)) for obj in objects]
            patch()
            for obj, was in zip(objects, before, strict=True):
                now = vars(obj)
                for attribute in set(was) | set(now):
                    old, new = was.get(attribute, MISSING), now.get(attribute, MISSING)
                    if old is not new:
                        self.changes.append((obj, attribute, old, new))

        setattr(module, self.name, recorded)

    def set(self, on: bool) -> None:
        for obj, attribute, old, new in self.changes:
            value = new if on else old
            if value is MISSING:
                delattr(obj, attribute)
            else:
                setattr(obj, attribute, value)


def run_jobs(stack: Any, count: int) -> None:
    """`count` four-stage jobs, each driven to its end as the integration tests drive one."""
    from tests.helpers.stack import receive_stage, wait_for_execution
    from tests.helpers.state_machine import agent_runs, start_job

    for _ in range(count):
        job_id = start_job(stack, "p-" + secrets.token_hex(4), STAGES)
        for _stage in STAGES:
            task, _receipt = receive_stage(stack, job_id, timeout=60)
            agent_runs(stack, task)
        ended = wait_for_execution(stack, job_id, timeout=60)
        assert ended["status"] == "SUCCEEDED", ended["status"]


def fill_table(stack: Any, items: int) -> None:
    """`items` items in partitions of ten, none a job of the bench's, as earlier tests leave them."""
    from relevo_core.aws import client

    dynamodb = client("dynamodb")
    body = "x" * 200
    requests = [
        {
            "PutRequest": {
                "Item": {
                    "pk": {"S": f"JOB#fill{n // 10:06d}"},
                    "sk": {"S": f"STAGE#{n % 10:03d}"},
                    "body": {"S": body},
                }
            }
        }
        for n in range(items)
    ]
    for start in range(0, len(requests), 25):
        batch = {stack.table_name: requests[start : start + 25]}
        while batch:
            batch = dynamodb.batch_write_item(RequestItems=batch).get("UnprocessedItems") or {}


def sample(stack: Any, jobs: int) -> tuple[float, float]:
    """CPU seconds of this process and wall seconds, per job."""
    cpu, wall = time.process_time(), time.perf_counter()
    run_jobs(stack, jobs)
    return (time.process_time() - cpu) / jobs, (time.perf_counter() - wall) / jobs


def measure(
    stack: Any, rows: dict[str, Callable[[bool], None]], rounds: int, jobs: int
) -> dict[str, dict[bool, list[tuple[float, float]]]]:
    samples: dict[str, dict[bool, list[tuple[float, float]]]] = {name: {True: [], False: []} for name in rows}
    for round_number in range(rounds):
        for index, (name, switch) in enumerate(rows.items()):
            for on in (True, False) if (round_number + index) % 2 == 0 else (False, True):
                switch(on)
                try:
                    samples[name][on].append(sample(stack, jobs))
                except (AssertionError, TimeoutError) as failed:
                    # Too slow for the stack's own timeouts (a function's, a wait's): no figure.
                    print(f"  {name} {'on' if on else 'off'}: the job failed: {failed}", flush=True)
                    samples[name][on].append((float("nan"), float("nan")))
                finally:
                    switch(True)
            on_cpu = statistics.median(s[0] for s in samples[name][True])
            off_cpu = statistics.median(s[0] for s in samples[name][False])
            print(
                f"  round {round_number + 1}: {name}: cpu/job on {on_cpu:.3f}s off {off_cpu:.3f}s", flush=True
            )
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=1, help="jobs per sample")
    parser.add_argument("--fill", type=int, default=0, help="items written to the table first")
    parser.add_argument("--only", default="", help="comma-separated patch names (default: every speed patch)")
    parser.add_argument("--every", action="store_true", help="one more row: every speed patch off at once")
    args = parser.parse_args()
    names = [name for name in args.only.split(",") if name] or list(SPEED_PATCHES)
    unknown = sorted(set(names) - set(SPEED_PATCHES))
    if unknown:
        print(f"not a speed patch: {unknown}", file=sys.stderr)
        return 2
    switches = {name: Switch(name) for name in SPEED_PATCHES}
    for switch in switches.values():
        switch.wrap()
    try:
        with harness.local_stack(prefix="relevo-bench-patches-") as stack:
            for name in names:
                assert switches[name].changes, f"{name} changed nothing the bench can switch"
            if args.fill:
                began = time.perf_counter()
                fill_table(stack, args.fill)
                print(f"table filled with {args.fill} items in {time.perf_counter() - began:.1f}s")
            run_jobs(stack, 1)  # warm: first imports, the functions' runtimes, every cache

            def every(on: bool) -> None:
                for switch in switches.values():
                    switch.set(on)

            rows: dict[str, Callable[[bool], None]] = {name: switches[name].set for name in names}
            if args.every:
                rows["every speed patch"] = every
            samples = measure(stack, rows, args.rounds, args.jobs)
    except Exception as failed:  # noqa: BLE001 (the bench reports its own failure)
        print(f"bench failed: {type(failed).__name__}: {failed}", file=sys.stderr)
        return 2
    print(
        f"\n{args.rounds} rounds of {args.jobs} four-stage job(s) a sample, "
        f"table filled with {args.fill} items; medians per job"
    )
    print(
        f"{'patch':<46} {'cpu on':>8} {'cpu off':>8} {'cpu gain':>9} {'(rounds)':>15} "
        f"{'wall on':>8} {'wall off':>8} {'wall gain':>9}"
    )
    for name, found in samples.items():
        cpu_on, cpu_off = (statistics.median(s[0] for s in found[on]) for on in (True, False))
        wall_on, wall_off = (statistics.median(s[1] for s in found[on]) for on in (True, False))
        # Each round's own gain (its off sample less its on sample): the spread beside the median.
        paired = [off[0] - on[0] for on, off in zip(found[True], found[False], strict=True)]
        spread = f"{min(paired):+.2f}..{max(paired):+.2f}"
        print(
            f"{name:<46} {cpu_on:>7.3f}s {cpu_off:>7.3f}s {cpu_off - cpu_on:>+8.3f}s {spread:>15} "
            f"{wall_on:>7.2f}s {wall_off:>7.2f}s {wall_off - wall_on:>+8.2f}s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
