"""Webhook intake benchmark: AWS calls per request and cold import time of the webhook handler.

    .venv/bin/python bench/intake.py [--warm N] [--import-runs N] [--only calls|imports|instructions]
                                     [--explain-imports] [--instructions]

1. AWS calls per request. The embedded stack (moto + template.yaml) is started, a project is
   registered through the API, and functions/webhook/handler.py is then called *in this process*
   with API Gateway REST proxy events. Every AWS API call made by the request's thread is recorded
   by wrapping botocore.endpoint.Endpoint.make_request (one per API call, whichever client made
   it: relevo_core's cached clients and Powertools' own Secrets Manager client alike) and
   Endpoint._send (one per HTTP attempt, so retries would show): bench/harness.py ThreadCalls, which
   tests/integration/test_webhook_call_counts.py uses to assert the same counts in `make test`.
   Calls made by other threads (moto's Step Functions interpreter runs in this process too) are not
   counted. A request made when the project was read PROJECT_CACHE_SEC or more before is shown on
   its own line, with one call (the GetItem that re-reads the project) more allowed: the emulator
   is slow enough that a long warm run can outlive the cache. So is a refusal that is its
   project's first of the minute in this container, with one call (the conditional PutItem of that
   minute's record of refusals) more allowed, and a busy project's job that this container did not
   yet know busy, with one call (the transaction the lock refuses) more allowed.
2. Cold import time. In fresh interpreters started with the Lambda runtime's environment, N runs
   each, interleaved, median: `import boto3, aws_lambda_powertools` (baseline), the library floor
   (the libraries the project's standards require in an API handler, with no Relevo code) and
   functions/webhook/handler.py; the target is handler / floor, Relevo's own part. Also printed:
   the handler with what its first verified delivery imports on top, so the figures also say what
   a container pays in all. When the ratio misses its target, the handler's extra imports are
   charged to what pulled them in (`python -X importtime`).
3. Import instructions (`--instructions`, or `--only instructions`; needs valgrind). Wall-clock
   medians on a shared machine swing by a third from run to run, so the same imports are also
   counted in CPU instructions under callgrind (PYTHONHASHSEED=0: the same count on every run,
   whatever else the machine does): the baseline, each library the standards require, the two
   that every API handler needs together (pydantic models + the Powertools event handler), the
   library floor and the handler, each less the interpreter's own start-up. Printed, not a target:
   it says how much of the handler's import the stack costs before any Relevo code runs.

Prints a table per part and exits 1 if a target is missed (2 if the bench itself broke).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402  (the repository root is on the path first)

WEBHOOK_DIR = harness.FUNCTIONS_DIR / "webhook"

# Handler ÷ library floor (issue 29): what Relevo's own modules may add to what its standards
# cost before any Relevo code runs.
IMPORT_RATIO_TARGET = 1.2
STAGES = [{"name": "build", "run": "true"}]

# The import-time children take the in-process handler's environment (bench/harness.py's
# HANDLER_ENV) and run as the Lambda runtime starts a function: the runtime's variables are set
# (the X-Ray SDK checks LAMBDA_TASK_ROOT and, inside Lambda, takes its local sampler instead of
# building a botocore client for the sampling API), tracing is on as the template's
# `Tracing: Active` has it, and the function's environment holds placeholder settings (nothing is
# read from AWS at import).
IMPORT_ENV = {
    **{k: v for k, v in harness.HANDLER_ENV.items() if k != "POWERTOOLS_TRACE_DISABLED"},
    "LAMBDA_TASK_ROOT": str(WEBHOOK_DIR),
    "AWS_LAMBDA_FUNCTION_NAME": "relevo-WebhookFunction",
    "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "512",
    "AWS_EXECUTION_ENV": "AWS_Lambda_python3.12",
    "_HANDLER": "handler.lambda_handler",
    "TABLE_NAME": "relevo-Table",
    "STATE_MACHINE_ARN": "arn:aws:states:us-east-1:123456789012:stateMachine:relevo-job",
    "QUEUED_STATE_MACHINE_ARN": "arn:aws:states:us-east-1:123456789012:stateMachine:relevo-job-queued",
    "ARTIFACT_BUCKET": "relevo-artifacts",
    "WORK_QUEUE_PREFIX": "relevo-work-",
    "QUEUE_LIMIT": "50",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
}


@dataclass
class Sample:
    calls: list[str]
    attempts: int
    status: int
    millis: float
    body: str
    # The project was last read PROJECT_CACHE_SEC or more ago: this request re-reads it (GetItem).
    cache_expired: bool
    # A refusal that is its project's first of the minute in this container: it stores the minute's
    # record of refused deliveries (one conditional PutItem; relevo_core.intake.webhooks.refusals).
    refusal_record_due: bool = False
    # A job of a busy project this container did not know busy (its first, or its memory lapsed:
    # BUSY_PROJECT_MEMORY_SEC): the transaction its project's lock refuses is one call more.
    lock_refusal_due: bool = False

    @property
    def extra_calls(self) -> int:
        return int(self.cache_expired) + int(self.refusal_record_due) + int(self.lock_refusal_due)


@dataclass
class Row:
    kind: str
    target: int | None  # max API calls per request with warm caches; None: informational
    expect_status: int
    samples: list[Sample] = field(default_factory=list)
    # Its deliveries find their project's lock taken (relevo_core.intake.busy_projects).
    project_busy: bool = False

    def allowed(self, sample: Sample) -> int | None:
        if self.target is None:
            return None
        return self.target + sample.extra_calls

    def sample_ok(self, sample: Sample) -> bool:
        allowed = self.allowed(sample)
        return sample.status == self.expect_status and (allowed is None or len(sample.calls) <= allowed)

    @property
    def ok(self) -> bool:
        return bool(self.samples) and all(self.sample_ok(sample) for sample in self.samples)


def measure_calls(warm_runs: int) -> tuple[list[Row], bool]:
    with harness.local_stack() as info:
        return _measure_calls(info, warm_runs)


def _measure_calls(stack: Any, warm_runs: int) -> tuple[list[Row], bool]:
    _, variables = harness.use_function_environment(stack, "WebhookFunction")
    # Each refusal logs a warning: the bench counts them, it does not print them.
    os.environ["POWERTOOLS_LOG_LEVEL"] = "ERROR"
    print("handler environment: " + ", ".join(f"{k}={v}" for k, v in sorted(variables.items())))

    from relevo_core.intake.webhooks.github import sign

    project_id = "bench-" + secrets.token_hex(3)
    secret = harness.register_project(stack, project_id, STAGES)
    repo = f"acme/{project_id}"

    # Cold container: no cached client, settings, project, secret or queue URL in this process.
    from relevo_core.config import intake_settings
    from relevo_core.intake.busy_projects import busy_projects
    from relevo_core.intake.project_cache import project_cache
    from relevo_core.intake.webhooks.refusals import refusal_minutes
    from relevo_core.store import locks

    handler = harness.cold_handler("webhook")

    settings = intake_settings()
    recorder = harness.ThreadCalls().install()

    def project_cache_expired() -> bool:
        # Read-only peek at the intake's project cache, to tell "warm" from "project re-read".
        read_at = project_cache.read_at(settings.table_name, project_id)
        return read_at is None or project_cache.clock() - read_at >= settings.project_cache_sec

    def deliver(
        row: Row,
        body: bytes,
        signature: str | None = None,
        delivery: str | None = None,
        event_name: str = "push",
    ) -> None:
        headers = harness.github_headers(
            secret, body, event=event_name, delivery=delivery, signature=signature
        )
        event = harness.webhook_event(project_id, headers, body)
        expired = project_cache_expired()
        # Read-only too: would a refusal now be its project's first of the minute here?
        record_due = row.expect_status >= 400 and refusal_minutes.due(settings.table_name, project_id)
        # And would a busy project's job try its lock first, not knowing it taken?
        lock_refusal_due = row.project_busy and not busy_projects.seems_busy(settings.table_name, project_id)
        recorder.start()
        began = time.perf_counter()
        try:
            # The handler's metrics (EMF documents on stdout) are not the bench's output.
            with contextlib.redirect_stdout(io.StringIO()):
                response = handler.lambda_handler(event, harness.LambdaContext())
        finally:
            elapsed = (time.perf_counter() - began) * 1000
            calls, attempts = recorder.stop()
        row.samples.append(
            Sample(
                list(calls),
                attempts,
                int(response["statusCode"]),
                elapsed,
                str(response.get("body"))[:200],
                expired,
                record_due,
                lock_refusal_due,
            )
        )

    def commit() -> str:
        return secrets.token_hex(20)

    cold = Row("cold accepted (first request)", None, 202)
    deliver(cold, harness.push_body(repo, commit()))

    # Refusals first, while the project and secret read by the cold request are surely cached.
    # Two of each: the first refusal of the project's minute stores that minute's record (shown
    # on a line of its own); every other refusal makes no call at all.
    forged = Row("refused: forged signature", 0, 401)
    malformed = Row("refused: malformed JSON, valid signature", 0, 400)
    too_large = Row("refused: body over 1 MiB", 0, 413)
    for _ in range(2):
        forged_body = harness.push_body(repo, commit())
        deliver(forged, forged_body, signature=sign("not-the-secret", forged_body))
        deliver(malformed, b'{"ref": "refs/heads/main", ')
        deliver(too_large, b'{"pad": "' + b"x" * (1024 * 1024) + b'"}')
    ping = Row("ignored: ping (its record)", 1, 200)
    deliver(ping, b'{"zen": "Keep it logically awesome."}', event_name="ping")

    def free_project() -> None:
        # Not measured: the project's lock given back by the jobs holding it, as a job that ended
        # gives it back (nothing runs the bench's jobs).
        for execution_name in locks.lock_holders(settings.table_name).get(project_id, []):
            locks.release(settings.table_name, project_id, execution_name)

    # A job whose project is free takes its lock in its own transaction, then starts (2 calls). A
    # job whose project is busy pays that transaction refused, then writes itself queued in a
    # second one (3: relevo_core.store.job_creation); the container then knows the project busy
    # and writes its next jobs queued in one (2: relevo_core.intake.busy_projects).
    warm = Row(f"warm accepted (x{warm_runs}, new commit each, its project free)", 2, 202)
    last_body = b""
    for _ in range(warm_runs):
        free_project()
        last_body = harness.push_body(repo, commit())
        deliver(warm, last_body)
    busy = Row(
        f"warm accepted, project busy (x{warm_runs}, its lock held by the job before)",
        2,
        202,
        project_busy=True,
    )
    for _ in range(warm_runs):
        last_body = harness.push_body(repo, commit())
        deliver(busy, last_body)

    duplicate = Row("duplicate (same body, new delivery id)", 1, 200)
    deliver(duplicate, last_body)
    redelivery = Row("redelivery (same body, same delivery id)", 1, 200)
    replayed_id = str(uuid.uuid4())
    replay_body = harness.push_body(repo, commit())
    deliver(Row("(setup)", None, 202), replay_body, delivery=replayed_id)
    deliver(redelivery, replay_body, delivery=replayed_id)

    rows = [cold, warm, busy, duplicate, redelivery, ping, forged, malformed, too_large]
    print_call_table(rows, settings.project_cache_sec)
    for row in rows:
        if row.target is None:
            continue
        # The summary's figure: the mean over the row's samples that were allowed no call more
        # (each sample is still held to what it was allowed: row.ok).
        plain = [len(sample.calls) for sample in row.samples if not sample.extra_calls]
        calls = statistics.mean(plain) if plain else float(max(len(sample.calls) for sample in row.samples))
        harness.report(
            "intake",
            f"AWS calls: {row.kind.split(' (')[0]}",
            calls,
            f"{calls:.2f}",
            f"<= {row.target}",
            row.ok,
        )
    return rows, all(row.ok for row in rows)


def _ops(samples: list[Sample]) -> str:
    sequences: dict[tuple[str, ...], int] = {}
    for sample in samples:
        sequences[tuple(sample.calls)] = sequences.get(tuple(sample.calls), 0) + 1
    return "; ".join(
        (f"{n}x " if len(samples) > 1 else "") + (" + ".join(seq) if seq else "(none)")
        for seq, n in sorted(sequences.items(), key=lambda item: -item[1])
    )


def _row_line(label: str, row: Row, samples: list[Sample], target: str) -> str:
    counts = [len(sample.calls) for sample in samples]
    calls = f"{statistics.mean(counts):.2f}" if len(counts) > 1 else str(counts[0])
    if len(counts) > 1 and max(counts) != min(counts):
        calls += f" (max {max(counts)})"
    attempts = statistics.mean(sample.attempts for sample in samples)
    millis = statistics.median(sample.millis for sample in samples)
    status = ",".join(str(s) for s in sorted({sample.status for sample in samples}))
    ok = all(row.sample_ok(sample) for sample in samples)
    return (
        f"{label:<44} {calls:>6} {attempts:>5.1f} {millis:>7.1f} {status:>7} {target:>6}  "
        f"{'ok' if ok else 'FAIL':<4} {_ops(samples)}"
    )


def print_call_table(rows: list[Row], project_cache_sec: float) -> None:
    print()
    print("AWS calls per webhook request (in-process handler, this thread only)")
    header = (
        f"{'request kind':<44} {'calls':>6} {'http':>5} {'ms':>7} {'status':>7} {'target':>6}  "
        f"{'ok':<4} operations"
    )
    print(header)
    print("-" * (len(header) + 40))
    expired_seen = record_seen = lock_seen = False
    for row in rows:
        cold = row.target is None
        # Warm samples first, then those allowed a call more, each on a line of its own.
        groups: dict[tuple[bool, bool, bool], list[Sample]] = {}
        for sample in row.samples:
            groups.setdefault(
                (False, False, False)
                if cold
                else (sample.cache_expired, sample.refusal_record_due, sample.lock_refusal_due),
                [],
            ).append(sample)
        for (expired, record_due, lock_due), samples in sorted(groups.items()):
            if not (expired or record_due or lock_due):
                print(_row_line(row.kind, row, samples, "-" if cold else f"<={row.target}"))
                continue
            expired_seen, record_seen = expired_seen or expired, record_seen or record_due
            lock_seen = lock_seen or lock_due
            why = ", ".join(
                label
                for label, on in (
                    ("project cache expired", expired),
                    ("first refusal of the minute", record_due),
                    ("not yet known busy", lock_due),
                )
                if on
            )
            print(
                _row_line(
                    f"  {row.kind.split(' (')[0].split(': ')[-1]}, {why}",
                    row,
                    samples,
                    f"<={row.allowed(samples[0])}",
                )
            )
        for sample in row.samples:
            if sample.status != row.expect_status:
                print(f"{'':<4}expected status {row.expect_status}, got {sample.status}: {sample.body}")
                break
    print(
        "calls: mean AWS API calls per request; http: mean HTTP attempts (retries included); ms: median "
        "latency"
    )
    if expired_seen:
        print(
            f"project cache expired: the project was read {project_cache_sec:g} s (PROJECT_CACHE_SEC) or "
            "more "
            "before the request, so the request re-reads it (one GetItem more is allowed)"
        )
    if record_seen:
        print(
            "first refusal of the minute: a project's first refused delivery of a minute in this container "
            "stores "
            "that minute's record of refusals (one conditional PutItem more is allowed); the others make no "
            "call"
        )
    if lock_seen:
        print(
            "not yet known busy: the container's first job of a busy project (or its first after "
            "BUSY_PROJECT_MEMORY_SEC) tries the lock, and the refused transaction is one call more; "
            "the container then writes the project's jobs queued at once"
        )


# ------------------------------------------------------------------------------------------------
# Cold import time

BASELINE_IMPORT = "import boto3, aws_lambda_powertools"
HANDLER_IMPORT = "import handler"
# What a container's first verified GitHub delivery imports on top (payload shapes, project,
# envelope, job store): paid once per container, by its first verified delivery, never by a refusal.
FIRST_VERIFIED_IMPORT = (
    "import handler; import relevo_core.intake.webhooks.verified, relevo_core.intake.webhooks.github"
)
# The libraries the project's standards put in every API handler (pydantic models at the boundary,
# Powertools logger/tracer/metrics, event handler, parameters), with none of Relevo's code: how
# much of the handler's time is the stack it is built on, and how much is Relevo's own.
LIBRARY_FLOOR_IMPORT = (
    "import boto3, aws_lambda_powertools; from pydantic import BaseModel, Field;"
    " exec('class Boundary(BaseModel):\\n    name: str = Field(min_length=1)');"
    " from aws_lambda_powertools import Logger, Metrics, Tracer; Logger(); Metrics(); "
    'Tracer(patch_modules=("botocore",));'
    " from aws_lambda_powertools.event_handler import APIGatewayRestResolver;"
    " from aws_lambda_powertools.utilities import parameters"
)


def _child_code(statement: str) -> str:
    return (
        "import sys, time\n"
        f"sys.path[:0] = [{str(WEBHOOK_DIR)!r}, {str(harness.CORE_DIR)!r}]\n"
        "t = time.perf_counter()\n"
        f"{statement}\n"
        "print(time.perf_counter() - t)\n"
    )


def _child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "PYTHON", "POWERTOOLS_"))}
    env.update(IMPORT_ENV)
    return env


def time_import(statement: str) -> float:
    result = subprocess.run(
        [sys.executable, "-c", _child_code(statement)],
        capture_output=True,
        text=True,
        env=_child_env(),
        cwd=ROOT,
        timeout=60,
    )
    if result.returncode != 0:
        raise RuntimeError(f"{statement!r} failed in a fresh interpreter:\n{result.stderr}")
    return float(result.stdout.strip().splitlines()[-1])


def import_tree(statement: str) -> list[tuple[str, int, list[str]]]:
    """(module, self µs, ancestors outermost first) for each module `python -X importtime` reports."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", _child_code(statement)],
        capture_output=True,
        text=True,
        env=_child_env(),
        cwd=ROOT,
        timeout=60,
    )
    lines = [
        line
        for line in result.stderr.splitlines()
        if line.startswith("import time:") and "self [us]" not in line
    ]
    # Children are printed before their parent: walk backwards so parents come first.
    modules: list[tuple[str, int, list[str]]] = []
    stack: list[str] = []
    for line in reversed(lines):
        self_us, _, raw = line[len("import time:") :].split("|", 2)
        level = (len(raw) - len(raw.lstrip()) - 1) // 2
        del stack[level:]
        name = raw.strip()
        modules.append((name, int(self_us), list(stack)))
        stack.append(name)
    return modules


PYDANTIC_PARTS = {"pydantic", "pydantic_core", "annotated_types", "typing_inspection", "typing_extensions"}


def _group(name: str, ancestors: list[str]) -> str:
    """Charge a module to the first thing outside relevo_core that relevo's code imported to get it."""
    via = "handler"
    for module in [*ancestors, name]:
        top = module.split(".")[0]
        if module == "handler" or top in ("relevo_core", "__editable___relevo_core_0_1_0_finder"):
            via = module if top == "relevo_core" else via
            continue
        depth = 3 if module.startswith("aws_lambda_powertools.") else 1
        package = "pydantic" if top in PYDANTIC_PARTS else ".".join(module.split(".")[:depth])
        return f"{package} (via {via})"
    return "relevo_core's own modules"


def explain_imports(runs: int) -> None:
    """The handler's import time beyond the baseline, charged to what relevo's code imports
    (self times from `python -X importtime`, which inflates them; median over runs)."""
    in_baseline = {name for name, _, _ in import_tree(BASELINE_IMPORT)}
    per_group: dict[str, list[float]] = {}
    for run in range(runs):
        totals: dict[str, float] = {}
        for name, self_us, ancestors in import_tree(HANDLER_IMPORT):
            if name in in_baseline:
                continue
            group = _group(name, ancestors)
            totals[group] = totals.get(group, 0.0) + self_us / 1000
        for group in set(per_group) | set(totals):
            per_group.setdefault(group, [0.0] * run).append(totals.get(group, 0.0))
    medians = {group: statistics.median(values) for group, values in per_group.items()}
    total = sum(medians.values())
    print(
        "what the handler imports beyond the baseline, by what pulled it in (-X importtime self time, "
        f"median of {runs}):"
    )
    for group, millis in sorted(medians.items(), key=lambda item: -item[1])[:8]:
        print(f"  {group:<66} {millis:7.1f} ms  {100 * millis / total:3.0f}%")
    print(f"  {'total beyond the baseline':<66} {total:7.1f} ms")


def measure_imports(runs: int, explain: bool = False) -> bool:
    # One discarded run each writes the bytecode caches, as a deployed package would ship them.
    statements = (BASELINE_IMPORT, HANDLER_IMPORT, LIBRARY_FLOOR_IMPORT, FIRST_VERIFIED_IMPORT)
    for statement in statements:
        time_import(statement)
    times: dict[str, list[float]] = {statement: [] for statement in statements}
    for _ in range(runs):  # interleaved, so machine load drifts hit all alike
        for statement in statements:
            times[statement].append(time_import(statement))
    baseline, handler, floor = times[BASELINE_IMPORT], times[HANDLER_IMPORT], times[LIBRARY_FLOOR_IMPORT]
    base_median, handler_median = statistics.median(baseline), statistics.median(handler)
    floor_median = statistics.median(floor)
    verified_median = statistics.median(times[FIRST_VERIFIED_IMPORT])
    ratio = handler_median / floor_median
    ok = ratio <= IMPORT_RATIO_TARGET
    harness.report(
        "intake",
        "webhook cold import, handler / library floor",
        ratio,
        f"{ratio:.2f} x",
        f"<= {IMPORT_RATIO_TARGET} x",
        ok,
    )
    print()
    print(f"cold import time, fresh interpreter, median of {runs} runs")
    print(
        f"  baseline  `{BASELINE_IMPORT}`: {base_median * 1000:7.1f} ms  (min {min(baseline) * 1000:.1f}, "
        f"max {max(baseline) * 1000:.1f})"
    )
    print(
        "  library floor (pydantic + Powertools logger/tracer/metrics/event handler/parameters, no Relevo "
        "code):"
        f" {floor_median * 1000:7.1f} ms = {floor_median / base_median:.2f}x baseline"
    )
    print(
        f"  handler   functions/webhook/handler.py:   {handler_median * 1000:7.1f} ms  (min "
        f"{min(handler) * 1000:.1f}, max {max(handler) * 1000:.1f})"
        f" = {handler_median / base_median:.2f}x baseline; Relevo's own share "
        f"{max(0.0, handler_median - floor_median) * 1000:.1f} ms"
    )
    print(
        f"  ratio handler / library floor {ratio:.2f}  target <= {IMPORT_RATIO_TARGET}  "
        f"{'ok' if ok else 'FAIL'}"
        f"  (ratio of minimums {min(handler) / min(floor):.2f})"
    )
    print(
        f"  handler + its first verified delivery's imports (payload shapes, project, envelope, job store):"
        f" {verified_median * 1000:.1f} ms = {verified_median / floor_median:.2f}x floor (not a target: "
        "paid once per"
        f" container by its first verified delivery, never by a refusal)"
    )
    if not ok or explain:
        explain_imports(5)
    return ok


# What the standards put in the webhook function, one library at a time and together, each on top
# of the baseline: the part of the ratio no Relevo code can remove.
INSTRUCTION_STATEMENTS = [
    ("baseline", BASELINE_IMPORT),
    ("+ pydantic (BaseModel)", f"{BASELINE_IMPORT}; from pydantic import BaseModel"),
    (
        "+ Powertools event handler",
        f"{BASELINE_IMPORT}; from aws_lambda_powertools.event_handler import APIGatewayRestResolver",
    ),
    (
        "+ Tracer patching botocore",
        f"{BASELINE_IMPORT}; from aws_lambda_powertools import Tracer; Tracer(patch_modules=('botocore',))",
    ),
    (
        "+ pydantic + event handler (every API handler)",
        f"{BASELINE_IMPORT}; from pydantic import BaseModel;"
        " from aws_lambda_powertools.event_handler import APIGatewayRestResolver",
    ),
    ("library floor (no Relevo code)", LIBRARY_FLOOR_IMPORT),
    ("handler", HANDLER_IMPORT),
    ("handler + first verified delivery's imports", FIRST_VERIFIED_IMPORT),
]


def count_instructions(statement: str) -> int:
    """CPU instructions a fresh interpreter executes for `statement`, start-up included."""
    with tempfile.TemporaryDirectory() as scratch:
        result = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={scratch}/callgrind.out",
                sys.executable,
                "-c",
                _child_code(statement),
            ],
            capture_output=True,
            text=True,
            env={**_child_env(), "PYTHONHASHSEED": "0"},
            cwd=ROOT,
            timeout=600,
        )
    if result.returncode != 0:
        raise RuntimeError(f"{statement!r} failed under callgrind:\n{result.stderr[-2000:]}")
    for line in result.stderr.splitlines():
        if "Collected :" in line:
            return int(line.rsplit(":", 1)[1])
    raise RuntimeError(f"callgrind printed no instruction count for {statement!r}")


def measure_instructions() -> bool:
    if shutil.which("valgrind") is None:
        print("\nimport instructions: valgrind is not installed; skipped")
        return True
    time_import(HANDLER_IMPORT)  # bytecode caches written, as a deployed package ships them
    # Counts do not depend on what else runs, so two interpreters are counted at a time.
    with ThreadPoolExecutor(max_workers=2) as pool:
        start_up_count = pool.submit(count_instructions, "pass")
        totals = list(pool.map(count_instructions, [statement for _, statement in INSTRUCTION_STATEMENTS]))
    start_up = start_up_count.result()
    counts = {
        label: total - start_up for (label, _), total in zip(INSTRUCTION_STATEMENTS, totals, strict=True)
    }
    baseline = counts["baseline"]
    print()
    print(
        f"import instructions (callgrind, PYTHONHASHSEED=0, interpreter start-up of {start_up / 1e6:.0f}M "
        "subtracted)"
    )
    for label, count in counts.items():
        print(f"  {label:<48} {count / 1e6:8.1f}M  {count / baseline:5.2f}x baseline")
    print(
        "  Relevo's own share (handler - library floor)     "
        f"{(counts['handler'] - counts['library floor (no Relevo code)']) / 1e6:8.1f}M"
    )
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--warm", type=int, default=20, help="warm accepted requests to average over")
    parser.add_argument(
        "--import-runs", type=int, default=7, help="fresh interpreters per import measurement"
    )
    parser.add_argument("--explain-imports", action="store_true", help="always print the import breakdown")
    parser.add_argument(
        "--instructions", action="store_true", help="also count import instructions (callgrind)"
    )
    parser.add_argument("--only", choices=("imports", "calls", "instructions"), help="run one part only")
    args = parser.parse_args()

    began = time.perf_counter()
    results: list[bool] = []
    steps: list[tuple[str, Callable[[], bool]]] = [
        ("imports", lambda: measure_imports(args.import_runs, args.explain_imports)),
        ("calls", lambda: measure_calls(args.warm)[1]),
        ("instructions", measure_instructions),
    ]
    wanted = (
        {args.only}
        if args.only
        else {"imports", "calls"} | ({"instructions"} if args.instructions else set())
    )
    steps = [(name, step) for name, step in steps if name in wanted]
    for name, step in steps:
        try:
            results.append(step())
        except Exception as exc:  # the bench broke: say where, distinct exit code
            print(f"{name}: bench error: {type(exc).__name__}: {exc}", file=sys.stderr)
            raise SystemExit(2) from exc
    print()
    print(
        f"total {time.perf_counter() - began:.1f}s: {'all targets met' if all(results) else 'TARGET MISSED'}"
    )
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
