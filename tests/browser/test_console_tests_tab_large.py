"""The Tests tab of a 20,000-test job in a real browser (headless Debian Chromium through
Playwright) on a local stack with a real relevo-agent: a stage of 4 shards ran, then each shard's
5,000 results stored as the agent stores them (relevo_tools.results_as_agent). The tab shows the
counts of all 20,000 and one page of them: the page's rows are the page size, and every request the
console made to GET /jobs/{id}/tests asked for one page, never the whole list."""

from __future__ import annotations

import secrets
from typing import Any

import pytest
from playwright.sync_api import expect

from relevo_cli.api import RelevoApi
from relevo_cli.console.views.job_tests import PAGE_SIZE
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

SHARDS, PER_SHARD = 4, 5_000  # 1 in 100 failing


def _ran_job(api: RelevoApi) -> dict[str, Any]:
    project_id = f"console-large-{secrets.token_hex(3)}"
    api.put_project(
        project_id,
        {
            "repo": f"acme/{project_id}",
            "region_affinity": CONSOLE_REGION,
            "lease_ttl_sec": 10,
            "queue_timeout_sec": 120,
            "stages": [{"name": "unit", "run": "echo testing", "parallel": SHARDS}],
        },
    )
    job_id = api.run_project(project_id, {"ref": "main", "commit": random_commit()})["job_id"]
    found: dict[str, Any] = {}

    def ended() -> bool:
        found.update(api.get_job(job_id))
        return found["status"] in ("succeeded", "failed", "canceled")

    wait_until(ended, 120, f"job {job_id}", interval=0.3)
    assert found["status"] == "succeeded", found
    return found


def _store_results(table: str, job: dict[str, Any]) -> None:
    record = client("dynamodb").get_item(
        TableName=table, Key={"pk": {"S": f"JOB#{job['job_id']}"}, "sk": {"S": "JOB"}}
    )["Item"]
    home = JobPrefix.of(envelope_of(from_attributes(record))["artifact_uri"])

    def put(bucket: str, key: str, body: bytes) -> None:
        client("s3").put_object(Bucket=bucket, Key=key, Body=body)

    for shard, ran in enumerate(job["stages"][0]["shards"]):
        tests = [
            result_of(
                f"tests.test_module_{n % 97}.TestCase",
                f"test_{shard}_{n:04d}",
                "failed" if n % 100 == 0 else "passed",
                duration_sec=(n % 13) * 0.01,
                message="AssertionError: assert 2 == 3" if n % 100 == 0 else None,
            )
            for n in range(PER_SHARD)
        ]
        summary = store_results_as_agent(
            put, home, job["job_id"], "unit", shard, ran["attempt"], ran["agent_id"], tests
        )
        client("dynamodb").update_item(
            TableName=table,
            Key={"pk": {"S": stages_pk(job["job_id"])}, "sk": {"S": shard_sk(0, shard)}},
            UpdateExpression="SET tests = :tests",
            ExpressionAttributeValues={":tests": to_attribute(summary)},
        )


def test_a_20000_test_job_shows_its_counts_and_one_page_never_the_whole_list(
    console_stack, operator_api, browser_page, monkeypatch
):
    # Given a job of 4 shards whose results hold 20,000 tests, 200 of them failing
    job = _ran_job(operator_api)
    _store_results(console_stack.table_name, job)
    # And every request the console makes of the API recorded
    asked: list[tuple[str, dict[str, Any]]] = []
    request = operator_api.request

    def recording(method: str, path: str, body: Any = None, params: dict[str, Any] | None = None) -> Any:
        asked.append((path, dict(params or {})))
        return request(method, path, body=body, params=params)

    monkeypatch.setattr(operator_api, "request", recording)

    with console_server(operator_api) as server:
        page = browser_page
        page.goto(server.url)
        asked.clear()
        # When the job's Tests tab is opened
        page.goto(f"{server.origin}/jobs/{job['job_id']}/tests")

        # Then the counts are of all 20,000 tests
        expect(page.locator("#test-counts")).to_contain_text("20,000 tests")
        expect(page.locator("#test-counts")).to_contain_text("19,800 passed")
        expect(page.locator("#test-counts")).to_contain_text("200 failed")
        expect(page.locator("nav.filters a[data-filter=all]")).to_have_text("All (20,000)")
        # And one page of them is rendered, the failures first
        rows = page.locator("#test-list tbody tr")
        expect(rows).to_have_count(PAGE_SIZE)
        expect(rows.nth(0)).to_contain_text("AssertionError: assert 2 == 3")
        expect(page.locator("#next-page")).to_have_count(1)
        # And the console asked the API for that one page only
        listings = [params for path, params in asked if path.endswith("/tests")]
        assert listings == [{"limit": PAGE_SIZE, "slowest": 10}], asked

        # When the next page is followed: the next page only, by its token
        asked.clear()
        page.click("#next-page")
        expect(page.locator("#first-page")).to_have_count(1)
        expect(rows).to_have_count(PAGE_SIZE)
        listings = [params for path, params in asked if path.endswith("/tests")]
        assert len(listings) == 1 and listings[0]["limit"] == PAGE_SIZE and listings[0]["page_token"]
