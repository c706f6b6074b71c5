"""The job page's Tests tab in a real browser (headless Debian Chromium through Playwright) on a
local stack with a real relevo-agent: a job with a stage of two shards ran, then its shards'
results stored as the agent stores them (relevo_tools.results_as_agent: the documents in S3 at
their keys, each summary on its shard's record), read back through the API's GET /jobs/{id}/tests:
the counts, the failures with their message, shard and Mac, the flaky test, the slowest, and the
pages followed by their links."""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from relevo_cli.api import RelevoApi
from relevo_core.aws import client
from relevo_core.models.job_objects import JobPrefix
from relevo_core.store.codec import envelope_of, from_attributes, to_attribute
from relevo_core.store.keys import shard_sk, stages_pk
from relevo_local.processes import random_commit
from relevo_tools.results_as_agent import result_of, store_results_as_agent
from tests.browser.conftest import CONSOLE_REGION
from tests.helpers.browser import console_server
from tests.helpers.stack import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300), pytest.mark.xdist_group("browser")]

# Shard 0: 240 tests (3 failing, with a file, a line and a message); shard 1: 10, one flaky.
SHARD0, SHARD1 = 240, 10


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    chosen = os.environ.get("RELEVO_CONSOLE_SCREENSHOTS")
    path = Path(chosen) if chosen else tmp_path_factory.mktemp("screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


def _ran_job(api: RelevoApi) -> dict[str, Any]:
    project_id = f"console-tests-{secrets.token_hex(3)}"
    api.put_project(
        project_id,
        {
            "repo": f"acme/{project_id}",
            "region_affinity": CONSOLE_REGION,
            "lease_ttl_sec": 10,
            "queue_timeout_sec": 120,
            "stages": [{"name": "unit", "run": "echo testing", "parallel": 2}],
        },
    )
    job_id = api.run_project(project_id, {"ref": "main", "commit": random_commit()})["job_id"]
    found: dict[str, Any] = {}

    def ended() -> bool:
        found.update(api.get_job(job_id))
        return found["status"] in ("succeeded", "failed", "canceled")

    wait_until(ended, 90, f"job {job_id}", interval=0.3)
    assert found["status"] == "succeeded", found
    return found


def _store_results(console_stack, job: dict[str, Any], artifact_uri: str) -> None:
    """Each shard's results as its agent stores them: the document, then the record's summary."""
    home = JobPrefix.of(artifact_uri)

    def put(bucket: str, key: str, body: bytes) -> None:
        client("s3").put_object(Bucket=bucket, Key=key, Body=body)

    shard0 = [
        result_of(
            f"tests.test_api.TestRoute{n % 7}",
            f"test_case_{n:03d}",
            "failed" if n in (5, 17, 230) else "passed",
            duration_sec=round(0.01 * (n % 50), 2),
            file="tests/test_api.py" if n in (5, 17, 230) else None,
            line=40 + n if n in (5, 17, 230) else None,
            message=f"AssertionError: expected 200, got 50{n % 3}" if n in (5, 17, 230) else None,
        )
        for n in range(SHARD0)
    ]
    shard1 = [
        result_of("tests.test_ui.TestLogin", f"test_screen_{n}", duration_sec=2.5 + n) for n in range(SHARD1)
    ]
    shard1[0] = result_of(
        "tests.test_ui.TestLogin", "test_screen_0", runs=["failed", "passed"], flaky=True, duration_sec=2.5
    )
    stage = job["stages"][0]
    for shard, tests in ((0, shard0), (1, shard1)):
        ran = stage["shards"][shard]
        summary = store_results_as_agent(
            put, home, job["job_id"], "unit", shard, ran["attempt"], ran["agent_id"], tests
        )
        client("dynamodb").update_item(
            TableName=console_stack.table_name,
            Key={"pk": {"S": stages_pk(job["job_id"])}, "sk": {"S": shard_sk(0, shard)}},
            UpdateExpression="SET tests = :tests",
            ExpressionAttributeValues={":tests": to_attribute(summary)},
        )


def test_the_tests_tab_shows_counts_failures_with_shard_and_mac_flaky_slowest_and_pages(
    console_stack, operator_api, browser_page, screenshots
):
    # Given a job whose stage ran as two shards on the console's Mac, and their results stored
    job = _ran_job(operator_api)
    record = client("dynamodb").get_item(
        TableName=console_stack.table_name, Key={"pk": {"S": f"JOB#{job['job_id']}"}, "sk": {"S": "JOB"}}
    )["Item"]
    _store_results(console_stack, job, envelope_of(from_attributes(record))["artifact_uri"])
    mac = job["stages"][0]["shards"][0]["agent_id"]

    with console_server(operator_api) as server:
        page = browser_page
        page.goto(server.url)
        page.goto(f"{server.origin}/jobs/{job['job_id']}")
        # When the Tests tab of the job page is opened
        page.click("#tests-tab")

        # Then the counts, the failures first with their message, shard and Mac
        expect(page.locator("#test-counts")).to_contain_text("250 tests")
        expect(page.locator("#test-counts")).to_contain_text("247 passed")
        expect(page.locator("#test-counts")).to_contain_text("1 flaky")
        expect(page.locator("#test-counts")).to_contain_text("3 failed")
        rows = page.locator("#test-list tbody tr")
        first = rows.nth(0)
        expect(first).to_contain_text("tests.test_api.TestRoute3::test_case_017")
        expect(first).to_contain_text(f"unit[0] on {mac}")
        expect(first).to_contain_text("tests/test_api.py:57")
        expect(first).to_contain_text("AssertionError: expected 200, got 502")
        # And the flaky test, counted once, with its runs; and the slowest (shard 1's)
        expect(page.locator("#flaky-tests tbody tr")).to_have_count(1)
        expect(page.locator("#flaky-tests")).to_contain_text("failed → passed")
        expect(page.locator("#slowest-tests tbody tr").first).to_contain_text("test_screen_9")
        page.screenshot(path=str(screenshots / "job-tests-tab.png"))

        # When the pages are followed: 100 a page, each test once
        seen = [*rows.locator(".test-id").all_inner_texts()]
        for _ in range(2):
            page.click("#next-page")
            seen += rows.locator(".test-id").all_inner_texts()
        assert len(seen) == 250 == len(set(seen))
        expect(page.locator("#next-page")).to_have_count(0)

        # When only the failures are asked for: the three, and no next page
        page.click("nav.filters a[data-filter=failed]")
        expect(rows).to_have_count(3)
        expect(page.locator("nav.filters a[aria-current=page]")).to_have_text("Failed (3)")

        # When a page token is altered: the API's refusal is shown, not a page of something else
        page.goto(f"{server.origin}/jobs/{job['job_id']}/tests?page_token=bm90LWEtdG9rZW4")
        expect(page.locator("body")).to_contain_text("QUERY_INVALID")
