"""relevo console: the job page's Tests tab of a 20,000-test job (issue 45), timed in headless
Chromium against the same tab of a 250-test job in the same run.

    .venv/bin/python bench/tests_tab.py [--tests 20000] [--baseline-tests 250] [--runs 3]

Starts `relevo local up` and one relevo-agent as processes (as bench/console.py does), runs two jobs
of a stage of 4 shards, and stores each shard's results as the agent stores them (the document in
S3, its summary on the shard's record; 1 test in 100 failing, as bench/results_page.py's). Then,
through the console on loopback and the API's GET /jobs/{id}/tests, for each job (best of --runs):

- navigation to /jobs/{id}/tests -> the first page's rows and the counts rendered;
- a click on Next page -> the next page rendered;
- a click on the Failed filter -> the failures rendered.

Targets: each within TARGET_RATIO x the 250-test job's and within TARGET_SEC (a page of 100 rows
either way: what grows is the reading of the documents behind the API).
Exits 0 when met, 1 when missed, 2 when the bench itself failed.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from bench.console import wait_for  # noqa: E402  (the repository root is on the path first)
from bench.harness import report  # noqa: E402

SHARDS = 4
REGION = "bench"
TARGET_RATIO = 3.0
TARGET_SEC = 1.0


def store_results(table: str, api: Any, job_id: str, tests: int) -> None:
    """Each shard's results as its agent stores them: the document, then the record's summary."""
    from relevo_core.aws import client
    from relevo_core.models.job_objects import JobPrefix
    from relevo_core.store.codec import envelope_of, from_attributes, to_attribute
    from relevo_core.store.keys import shard_sk, stages_pk
    from relevo_tools.results_as_agent import result_of, store_results_as_agent

    record = client("dynamodb").get_item(
        TableName=table, Key={"pk": {"S": f"JOB#{job_id}"}, "sk": {"S": "JOB"}}
    )["Item"]
    home = JobPrefix.of(envelope_of(from_attributes(record))["artifact_uri"])

    def put(bucket: str, key: str, body: bytes) -> None:
        client("s3").put_object(Bucket=bucket, Key=key, Body=body)

    for shard, ran in enumerate(api.get_job(job_id)["stages"][0]["shards"]):
        results = [
            result_of(
                f"tests.test_module_{n % 97}.TestCase",
                f"test_{shard}_{n}[param-{n}]",
                "failed" if n % 100 == 0 else "passed",
                duration_sec=(n % 13) * 0.01,
                file=f"tests/test_module_{n % 97}.py",
                line=10 + n % 400,
                message="AssertionError: assert 2 == 3\n" + "context line\n" * 5 if n % 100 == 0 else None,
            )
            for n in range(tests // SHARDS)
        ]
        summary = store_results_as_agent(
            put, home, job_id, "unit", shard, ran["attempt"], ran["agent_id"], results
        )
        client("dynamodb").update_item(
            TableName=table,
            Key={"pk": {"S": stages_pk(job_id)}, "sk": {"S": shard_sk(0, shard)}},
            UpdateExpression="SET tests = :tests",
            ExpressionAttributeValues={":tests": to_attribute(summary)},
        )


def time_tab(page: Any, origin: str, job_id: str, runs: int) -> dict[str, float]:
    """The best of `runs` of each step, in seconds."""
    rows = page.locator("#test-list tbody tr")
    steps: dict[str, list[float]] = {"first page": [], "next page": [], "failed filter": []}
    for _ in range(runs):
        began = time.perf_counter()
        page.goto(f"{origin}/jobs/{job_id}/tests")
        page.locator("#test-counts").wait_for()
        rows.nth(99).wait_for()
        steps["first page"].append(time.perf_counter() - began)
        began = time.perf_counter()
        page.click("#next-page")
        page.locator("#first-page").wait_for()
        rows.first.wait_for()
        steps["next page"].append(time.perf_counter() - began)
        began = time.perf_counter()
        page.click("nav.filters a[data-filter=failed]")
        page.locator("nav.filters a[aria-current=page][data-filter=failed]").wait_for()
        rows.first.wait_for()
        steps["failed filter"].append(time.perf_counter() - began)
    return {step: min(times) for step, times in steps.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", type=int, default=20_000)
    parser.add_argument("--baseline-tests", type=int, default=250)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    chromium = os.environ.get("RELEVO_CHROMIUM") or shutil.which("chromium")
    if chromium is None:
        print("bench/tests_tab.py: no Chromium: install Debian's chromium", file=sys.stderr)
        return 2

    from playwright.sync_api import sync_playwright

    from relevo_cli.api import RelevoApi
    from relevo_cli.console.server import ConsoleServer
    from relevo_cli.console.state import Console
    from relevo_core.aws import reset_clients
    from relevo_local.processes import agent_process, local_stack, random_commit, write_agent_config

    with tempfile.TemporaryDirectory(prefix="relevo-bench-tests-tab-") as scratch:
        work = Path(scratch)
        with local_stack(work, work / "local-up.log", ["--region-affinities", REGION]) as stack:
            for name, value in stack.environment().items():
                os.environ[name] = value
            reset_clients()
            config = write_agent_config(
                work / "agent.toml", work / "stack.json", REGION, "bench-mac", poll_wait_sec=1, capacity=2
            )
            api = RelevoApi.for_stack(stack)
            project = f"bench-{secrets.token_hex(3)}"
            api.put_project(
                project,
                {
                    "repo": f"acme/{project}",
                    "region_affinity": REGION,
                    "queue_timeout_sec": 120,
                    "stages": [{"name": "unit", "run": "echo testing", "parallel": SHARDS}],
                },
            )
            with (
                agent_process(config, work / "agent.log"),
                ConsoleServer(Console(api), port=0) as server,
                sync_playwright() as playwright,
            ):
                jobs = {}
                for tests in (args.baseline_tests, args.tests):
                    job_id = api.run_project(project, {"ref": "main", "commit": random_commit()})["job_id"]
                    wait_for(
                        lambda job_id=job_id: api.get_job(job_id)["status"] in ("succeeded", "failed"),
                        300,
                        "the job to end",
                    )
                    store_results(stack.table_name, api, job_id, tests)
                    jobs[tests] = job_id
                browser = playwright.chromium.launch(
                    executable_path=chromium, headless=True, args=["--no-sandbox"]
                )
                page = browser.new_page()
                page.goto(server.url)
                # One untimed pass of each: the functions behind the API started (a cold start
                # is the local stack's, not the page's).
                for job_id in jobs.values():
                    time_tab(page, server.origin, job_id, 1)
                baseline = time_tab(page, server.origin, jobs[args.baseline_tests], args.runs)
                large = time_tab(page, server.origin, jobs[args.tests], args.runs)
                browser.close()
    worst = True
    for step, seconds in large.items():
        ratio = seconds / baseline[step]
        ok = ratio <= TARGET_RATIO and seconds <= TARGET_SEC
        worst = worst and ok
        print(
            f"{step}: {args.tests:,} tests {seconds:.3f} s, {args.baseline_tests} tests "
            f"{baseline[step]:.3f} s: {ratio:.2f} x (target <= {TARGET_RATIO} x and <= {TARGET_SEC} s)"
        )
        report(
            "tests_tab",
            f"Tests tab, {args.tests:,} tests, {step} / {args.baseline_tests} tests",
            ratio,
            f"{ratio:.2f} x ({seconds:.2f} s)",
            f"<= {TARGET_RATIO} x, <= {TARGET_SEC} s",
            ok,
        )
    return 0 if worst else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as exc:  # the bench itself failed: exit 2, as the other benches do
        print(f"bench/tests_tab.py failed: {exc!r}", file=sys.stderr)
        sys.exit(2)
