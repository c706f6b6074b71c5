"""The console's job page says a stage's built-in release effect (issue 44, point 6), in Chromium:
a real agent (in this process) runs a job on the local stack whose later stage puts the file the
earlier one handed on (effect: s3_object), and the page's Release table names the kind, where the
effect stands and the identifiers the kind recorded."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import pytest

from relevo_agent.effects import registry
from relevo_cli.api import RelevoApi
from relevo_core.aws import client
from tests.helpers.agents import agent_at
from tests.helpers.browser import console_server
from tests.helpers.stack import wait_for_execution
from tests.integration.test_effect_stage_run import (  # noqa: F401 - release_profile: a fixture
    _counted,
    _project,
    _run_next,
    release_profile,
)

pytestmark = pytest.mark.timeout(240)


def test_the_job_page_has_a_release_table_naming_the_effect_and_its_identifiers(
    local_stack,
    project_id,
    tmp_path,
    release_profile,  # noqa: F811 - the imported fixture, asked for
    monkeypatch,
    browser_page,
):
    # Given a job whose publish stage put the handed-on App.zip at an S3 key (s3_object), once
    bucket = "dl-" + secrets.token_hex(4)
    client("s3").create_bucket(Bucket=bucket)
    api = RelevoApi.for_stack(local_stack)
    _project(api, project_id, bucket)
    puts: list[str] = []
    monkeypatch.setitem(registry.KINDS, "s3_object", _counted(puts))
    job_id = api.run_project(project_id, {"ref": "main"})["job_id"]
    mac = agent_at(tmp_path, local_stack, "mac-a")
    assert [_run_next(local_stack, mac, job_id)["stage"] for _ in range(2)] == ["build", "publish"]
    assert wait_for_execution(local_stack, job_id)["status"] == "SUCCEEDED" and puts == ["app/App.zip"]
    outputs = api.get_job(job_id)["stages"][1]["outputs"]

    # When its page is opened in the console
    with console_server(api) as server:
        browser_page.goto(server.url)  # the token, exchanged for the cookie
        browser_page.goto(server.origin + f"/jobs/{job_id}")
        # The page renders the panel, then replaces it on the stream's first state and on its
        # `done` (static/job.js refreshPanel); "ended" shows once that last refresh is in, so a
        # row read after it is not replaced under the reader.
        browser_page.locator("#connection", has_text="ended (succeeded)").wait_for(timeout=30_000)
        row = browser_page.locator('table.release tr[data-stage="publish"]')
        row.wait_for(timeout=30_000)

        # Then the Release table has the publish stage alone, its kind, the effect in words and its ids
        assert browser_page.locator("table.release tbody tr").count() == 1
        assert row.get_attribute("data-effect") == "s3_object"
        cells = row.locator("td").all_inner_texts()
        assert cells[:4] == ["publish", "s3_object", f"put s3://{bucket}/app/App.zip", "—"], cells
        shown = row.locator("td.identifiers div").all_inner_texts()
        assert shown == [
            f"s3_uri = s3://{bucket}/app/App.zip",
            f"etag = {outputs['etag']}",
            f"sha256 = {outputs['sha256']}",
        ], shown
        where = Path(os.environ.get("RELEVO_CONSOLE_SCREENSHOTS") or tmp_path)
        browser_page.locator("table.release").scroll_into_view_if_needed()
        browser_page.screenshot(path=str(where / "job-release.png"), full_page=True)
