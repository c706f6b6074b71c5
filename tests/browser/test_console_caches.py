"""The console's Caches page and the job page's cache lines in a real browser (headless Debian
Chromium through Playwright) on a local stack with a real relevo-agent: a project's job saved its
dependency cache and the next job restored it (a hit), and one more entry was saved by the agent's
own cache code; the Caches page lists exactly the entries the table holds and exactly what
`relevo cache list --json` prints (keys, sizes, files, times, hits, the total against the limit),
deleting an entry from the page removes it from the store and the CLI's listing, a viewer's Delete
is disabled with why, and the job page says each cache outcome in `relevo job view`'s words."""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect
from typer.testing import CliRunner

from relevo_agent.caches import CacheContext
from relevo_cli.api import RelevoApi
from relevo_cli.main import app
from relevo_core.models.cache import CacheSpec
from relevo_core.models.transfer import human_bytes
from relevo_core.store import cache_entries
from relevo_local.processes import random_commit
from tests.browser.conftest import CONSOLE_REGION
from tests.helpers.browser import console_server
from tests.helpers.iam import iam_user
from tests.helpers.stack import wait_until
from tests.integration.test_caches import Mac

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300), pytest.mark.xdist_group("browser")]

runner = CliRunner()

# The stage builds its dependencies only when the cache did not bring them.
BUILD = (
    'if [ -f .deps/lib.txt ]; then echo "deps restored: $(wc -l < .deps/lib.txt) lines"; '
    "else mkdir -p .deps && seq 1 2000 > .deps/lib.txt && echo built > .deps/built.txt && echo built; fi"
)
DEPS = {"name": "deps", "paths": [".deps"], "key": "deps-{arch}-{hash:deps.lock}"}
# An entry saved by the agent's own cache code (relevo_agent.caches) on another Mac of the region.
TOOLS = CacheSpec(name="tools", paths=("build",), key="tools-{hash:Package.resolved}")


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    chosen = os.environ.get("RELEVO_CONSOLE_SCREENSHOTS")
    path = Path(chosen) if chosen else tmp_path_factory.mktemp("screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


class SetClock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


class ConsoleMac(Mac):
    """A Mac of the console's region (the integration tests' Mac is in eu-west)."""

    def context(self) -> CacheContext:
        return dataclasses.replace(super().context(), region=CONSOLE_REGION)


def _run(api: RelevoApi, project_id: str) -> dict[str, Any]:
    job_id = api.run_project(project_id, {"ref": "main", "commit": random_commit()})["job_id"]
    found: dict[str, Any] = {}

    def ended() -> bool:
        found.update(api.get_job(job_id))
        return found["status"] in ("succeeded", "failed", "canceled")

    wait_until(ended, 90, f"job {job_id}", interval=0.3)
    assert found["status"] == "succeeded", found
    return found


def _cli(stack_file: Path, *args: str) -> str:
    answer = runner.invoke(app, [*args, "--stack-file", str(stack_file)], terminal_width=300)
    assert answer.exit_code == 0, answer.output
    return answer.output


def _page_rows(page) -> list[dict[str, Any]]:
    """The Caches page's entries as it shows them (the exact bytes and times are its titles)."""
    return page.eval_on_selector_all(
        "#cache-entries tbody tr[data-key]",
        """rows => rows.map(row => ({
            cache_key: row.querySelector(".key").textContent,
            size_text: row.querySelector(".size").textContent,
            size: Number(row.querySelector(".size").dataset.bytes),
            files: Number(row.querySelector(".files").textContent),
            created_at: row.querySelector(".created time").getAttribute("datetime"),
            last_used_at: row.querySelector(".last-used time").getAttribute("datetime"),
            hits: Number(row.querySelector(".hits").textContent),
            job_id: row.querySelector(".saved-by a") ? row.querySelector(".saved-by a").textContent : null,
        }))""",
    )


def _as_shown(entry: dict[str, Any]) -> dict[str, Any]:
    shown = {
        name: entry[name] for name in ("cache_key", "size", "files", "created_at", "last_used_at", "hits")
    }
    return {**shown, "size_text": human_bytes(entry["size"]), "job_id": entry["job_id"]}


@pytest.fixture(scope="module")
def cached_project(console_stack, operator_api, tmp_path_factory) -> dict[str, Any]:
    """A project whose build stage caches its dependencies: a first job saved them, the next
    restored them (a hit) on the console's Mac; and another Mac of the region saved an entry of
    the project's other cache, earlier."""
    project_id = f"console-caches-{secrets.token_hex(3)}"
    operator_api.put_project(
        project_id,
        {
            "repo": f"acme/{project_id}",
            "region_affinity": CONSOLE_REGION,
            "lease_ttl_sec": 10,
            "queue_timeout_sec": 120,
            "caches": [DEPS, TOOLS.model_dump(mode="json")],
            "stages": [{"name": "build", "run": BUILD, "cache": ["deps"]}],
        },
    )
    first = _run(operator_api, project_id)
    second = _run(operator_api, project_id)
    assert [c["save"] for c in first["stages"][0]["caches"]] == ["saved"], first["stages"][0]
    assert [c["restore"] for c in second["stages"][0]["caches"]] == ["hit"], second["stages"][0]
    root = tmp_path_factory.mktemp("caches")
    other = ConsoleMac(
        console_stack, root / "mac-b", project_id, clock=SetClock(datetime(2026, 12, 1, tzinfo=UTC))
    )
    (other.workspace / "build").mkdir()
    (other.workspace / "build" / "tool.txt").write_text("tool\n" * 300)
    (other.workspace / "Package.resolved").write_text("pins\n")
    assert other.stage(TOOLS).save == "saved"
    stack_file = root / "stack.json"
    stack_file.write_text(json.dumps(console_stack.model_dump()))
    return {"project": project_id, "first": first, "second": second, "stack_file": stack_file}


def test_the_caches_page_and_relevo_cache_list_agree_with_the_store(
    console_stack, operator_api, browser_page, screenshots, cached_project
):
    # Given the project's two entries in the table: the dependencies (saved by a job, restored
    # once) and the other Mac's
    project_id, stack_file = cached_project["project"], cached_project["stack_file"]
    scope = f"{project_id}/{CONSOLE_REGION}"
    stored = sorted(
        (dataclasses.asdict(r) for r in cache_entries.list_entries(console_stack.table_name, scope)),
        key=lambda entry: entry["last_used_at"],
        reverse=True,
    )
    assert len(stored) == 2 and stored[0]["hits"] == 1
    assert stored[0]["job_id"] == cached_project["first"]["job_id"]
    viewer = iam_user(console_stack, f"cache-viewer-{secrets.token_hex(3)}")
    operator_api.grant(project_id, viewer.arn, "view")

    with console_server(operator_api) as server:
        page = browser_page
        page.goto(server.url)
        # When the Caches page is reached from the console's navigation and the project's row
        page.get_by_role("navigation", name="Console").get_by_role("link", name="Caches").click()
        page.get_by_role("link", name=project_id, exact=True).click()
        expect(page.locator("h1")).to_contain_text(f"Caches of {project_id}")
        listed = json.loads(_cli(stack_file, "cache", "list", project_id, "--json"))

        # Then it lists exactly the table's entries, most recently used first, as the CLI does
        shown = _page_rows(page)
        assert shown == [_as_shown(entry) for entry in stored]
        assert listed["entries"] == stored
        assert [row["cache_key"] for row in shown] == [entry["cache_key"] for entry in listed["entries"]]
        # And the total against the project's limit is the CLI's
        total = page.locator("#cache-total")
        assert (
            int(total.get_attribute("data-total-bytes"))
            == listed["total_bytes"]
            == sum(entry["size"] for entry in stored)
        )
        assert int(total.get_attribute("data-max-total-bytes")) == listed["max_total_bytes"] == 10 * 1024**3
        expect(total).to_contain_text(
            f"2 entries in {CONSOLE_REGION}: {human_bytes(listed['total_bytes'])} of 10.0 GiB"
        )
        expect(total).to_contain_text(f"unused for {listed['retention_days']} days")
        page.screenshot(path=str(screenshots / "caches.png"), full_page=True)

        # When another page on this machine posts a delete with the session's cookie, Then it is
        # refused (its Origin is not the console's), and a body with no key is refused by its error
        delete_url = f"{server.origin}/projects/{project_id}/caches/delete"
        body = {"key": stored[1]["cache_key"], "region": CONSOLE_REGION}
        forged = page.request.post(delete_url, data=body, headers={"Origin": "http://127.0.0.1:9"})
        assert forged.status == 403 and "refused" in forged.text(), forged.text()
        no_key = page.request.post(
            delete_url, data={"region": CONSOLE_REGION}, headers={"Origin": server.origin}
        )
        assert no_key.status == 400 and no_key.json()["error"] == "VALIDATION_FAILED"
        assert len(cache_entries.list_entries(console_stack.table_name, scope)) == 2

        # When the older entry is deleted from the page
        older = stored[1]["cache_key"]
        page.locator(f"#cache-entries tr[data-key='{older}']").get_by_role("button", name="Delete").click()

        # Then the store, the CLI and the page all hold the newer one only
        # (the delete reaches the API, then the page reloads and lists again: on a loaded host that
        # is more than expect's default 5 s; CI saw the reload land at the very end of it)
        expect(page.locator("#cache-entries tbody tr[data-key]")).to_have_count(1, timeout=30_000)
        assert cache_entries.get_entry(console_stack.table_name, scope, older) is None
        listed = json.loads(_cli(stack_file, "cache", "list", project_id, "--json"))
        assert [row["cache_key"] for row in _page_rows(page)] == [e["cache_key"] for e in listed["entries"]]
        assert [e["cache_key"] for e in listed["entries"]] == [stored[0]["cache_key"]]

    # When a viewer opens the page, Then Delete is disabled, saying why, and nothing is deleted
    with console_server(viewer.api) as server:
        browser_page.goto(server.url)
        browser_page.goto(f"{server.origin}/projects/{project_id}/caches?region={CONSOLE_REGION}")
        button = browser_page.get_by_role("button", name="Delete")
        expect(button).to_be_disabled()
        assert button.get_attribute("title") == (
            f"{viewer.arn} has view on project {project_id}; Delete needs operate"
        )
        # And a delete posted past the disabled button is the API's refusal, passed on
        forced = browser_page.request.post(
            f"{server.origin}/projects/{project_id}/caches/delete",
            data={"key": stored[0]["cache_key"], "region": CONSOLE_REGION},
            headers={"Origin": server.origin},
        )
        assert forced.status == 403 and forced.json()["error"] == "FORBIDDEN", forced.text()
        assert "needs operate" in forced.json()["message"]
    assert cache_entries.get_entry(console_stack.table_name, scope, stored[0]["cache_key"]) is not None


def test_the_job_page_says_each_cache_outcome_as_relevo_job_view_does(
    operator_api, browser_page, screenshots, cached_project
):
    # Given the job that saved the project's dependency cache and the one that restored it
    first, second, stack_file = (
        cached_project["first"],
        cached_project["second"],
        cached_project["stack_file"],
    )
    key = second["stages"][0]["caches"][0]["key"]

    with console_server(operator_api) as server:
        page = browser_page
        page.goto(server.url)
        # When the job that restored it is opened
        page.goto(f"{server.origin}/jobs/{second['job_id']}")

        # Then its build stage's cache line is `relevo job view`'s, word for word: a hit, with
        # the key, the bytes, the bytes downloaded and the seconds
        line = page.locator("li.cache-line[data-stage=build][data-cache=deps]")
        expect(line).to_have_count(1)
        text = line.inner_text()
        assert text.startswith(f"build cache deps: hit {key}: ") and " downloaded" in text, text
        assert text in _cli(stack_file, "job", "view", second["job_id"]).splitlines()
        page.locator("h2", has_text="Caches").evaluate("heading => heading.scrollIntoView()")
        page.screenshot(path=str(screenshots / "job-cache-line.png"))

        # When the job that saved it is opened, Then its line says the miss and what the save did
        page.goto(f"{server.origin}/jobs/{first['job_id']}")
        saved = page.locator("li.cache-line[data-stage=build]").inner_text()
        assert saved.startswith(f"build cache deps: miss {key}; saved "), saved
        assert saved in _cli(stack_file, "job", "view", first["job_id"]).splitlines()

        # And its link leads to the project's Caches page in the job's region
        page.get_by_role("link", name="the project's caches").click()
        expect(page.locator("h1")).to_contain_text(f"Caches of {cached_project['project']}")
        expect(page.locator("#cache-region")).to_have_value(CONSOLE_REGION)
