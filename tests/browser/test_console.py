"""The console in a real browser (headless Debian Chromium through Playwright) on a local stack
with a real relevo-agent (issue 18, "Done when"): live log lines, a cut stream resumed with no gap
or repeat, approve at the gate, cancel, rerun from a stage, an artifact download checked by
sha256, a view-only user's disabled buttons with their reasons, and the CSRF and DNS-rebinding
checks refusing (a refused approve writes nothing: the job still waits, as the API says)."""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests
from playwright.sync_api import expect

from relevo_cli.api import ApiError, RelevoApi
from relevo_cli.console.views.job import LOG_MAX_LINES
from relevo_cli.words import exact_time
from relevo_core.store import freezes
from relevo_local.processes import random_commit
from tests.browser.conftest import (
    CONSOLE_REGION,
    MASKING_REGION,
    SECRET_VALUE,
    SECRET_VARIABLE,
    UPLOAD_BYTES_PER_SEC,
)
from tests.helpers.browser import console_server, git_remote
from tests.helpers.iam import iam_user
from tests.helpers.stack import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300), pytest.mark.xdist_group("browser")]
# The module's second half runs as a group of its own (on another worker when one is free), on
# that worker's console stack: each test makes its own projects and jobs.
SECOND_GROUP = pytest.mark.xdist_group("browser-2")

ENDED = ("succeeded", "failed", "canceled")


def _project(api: RelevoApi, stages: list[dict[str, Any]], **extra: Any) -> str:
    project_id = f"console-{secrets.token_hex(3)}"
    api.put_project(
        project_id,
        {
            "repo": f"acme/{project_id}",
            "region_affinity": CONSOLE_REGION,
            "lease_ttl_sec": 10,
            "queue_timeout_sec": 120,
            "stages": stages,
            **extra,
        },
    )
    return project_id


def _run(api: RelevoApi, project_id: str) -> str:
    return api.run_project(project_id, {"ref": "main", "commit": random_commit()})["job_id"]


def _wait_job(api: RelevoApi, job_id: str, until, timeout: float = 90) -> dict[str, Any]:
    found: dict[str, Any] = {}

    def check() -> bool:
        found.update(api.get_job(job_id))
        return until(found)

    wait_until(check, timeout, f"job {job_id}", interval=0.3)
    return found


def _open(page, server, path: str) -> None:
    page.goto(server.url)  # the token, exchanged for the cookie
    page.goto(server.origin + path)


def _lines(page) -> list[str]:
    return page.locator("#log-lines .line").all_inner_texts()


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the pages are photographed: RELEVO_CONSOLE_SCREENSHOTS (the README's come from
    `RELEVO_CONSOLE_SCREENSHOTS=docs/screenshots`), else a temporary directory."""
    chosen = os.environ.get("RELEVO_CONSOLE_SCREENSHOTS")
    path = Path(chosen) if chosen else tmp_path_factory.mktemp("screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


def _screenshot(page, directory: Path, name: str) -> None:
    page.screenshot(path=str(directory / f"{name}.png"), full_page=True)


GATED = {"approval": {"enabled": True, "before": "deploy"}}
TWO_STAGES = [{"name": "build", "run": "echo compiled"}, {"name": "deploy", "run": "echo deployed"}]


def test_log_lines_arrive_live_and_a_cut_stream_resumes_with_no_gap_or_repeat(
    operator_api, browser_page, screenshots, tmp_path
):
    # Given a stage that prints 60 numbered lines over about 6 s, its second half once the test
    # has seen the first live (on a loaded host the page showed line 5 after the whole stage had
    # run), and a console whose streams are cut every 1.5 s (the server ends them; the page
    # reconnects from the last seq it shows)
    count, go = 60, tmp_path / "go"
    half = count // 2
    print_lines = 'do echo "line $i"; sleep 0.1; done'
    project_id = _project(
        operator_api,
        [
            {
                "name": "build",
                "run": f"for i in $(seq 1 {half}); {print_lines}; {_wait_for(go)}; "
                f"for i in $(seq {half + 1} {count}); {print_lines}",
            }
        ],
    )
    streams: list[str] = []
    browser_page.on(
        "request", lambda request: streams.append(request.url) if "/stream?" in request.url else None
    )
    with console_server(operator_api, lifetime_sec=1.5) as server:
        job_id = _run(operator_api, project_id)
        _open(browser_page, server, f"/jobs/{job_id}")
        # When the lines are printed, they show up while the stage still runs
        browser_page.locator("#log-lines .line", has_text=re.compile(r"^line 5$")).wait_for(timeout=60_000)
        assert "line " + str(count) not in _lines(browser_page)
        assert operator_api.get_job(job_id)["status"] == "running"
        expect(browser_page.locator("#connection")).to_have_text("live", timeout=10_000)  # between two cuts
        _screenshot(browser_page, screenshots, "job-live-logs")
        go.touch()
        _wait_job(operator_api, job_id, lambda job: job["status"] in ENDED)
        browser_page.locator("#connection", has_text="ended").wait_for(timeout=30_000)
        # Then every line is there once, in order, across the cuts
        assert _lines(browser_page) == [f"line {i}" for i in range(1, count + 1)]
    resumed_from = [int(re.search(r"from_seq=(\d+)", url).group(1)) for url in streams]
    assert len(resumed_from) >= 3, streams
    assert resumed_from == sorted(resumed_from) and resumed_from[-1] > 0, resumed_from


def test_approve_at_the_gate_with_the_button_then_rerun_from_a_stage(operator_api, browser_page):
    # Given a job of two stages waiting at the gate before deploy
    project_id = _project(operator_api, TWO_STAGES, **GATED)
    job_id = _run(operator_api, project_id)
    with console_server(operator_api) as server:
        _open(browser_page, server, f"/jobs/{job_id}")
        # When the log says it waits and the operator approves with a reason
        browser_page.locator("#gate-note", has_text="Waiting for approval before deploy").wait_for(
            timeout=60_000
        )
        approve = browser_page.get_by_role("button", name="Approve", exact=True)
        expect(approve).to_be_enabled(timeout=15_000)  # the panel follows the job's state events
        browser_page.get_by_label("Reason").fill("release 4.2 signed off")
        approve.click()
        # Then the job runs deploy and succeeds, and the API records who approved and why
        job = _wait_job(operator_api, job_id, lambda job: job["status"] in ENDED)
        assert job["status"] == "succeeded", job
        assert job["approval_decision"]["decision"] == "approved"
        assert job["approval_decision"]["reason"] == "release 4.2 signed off"
        browser_page.locator("#job-status", has_text="succeeded").wait_for(timeout=30_000)
        # (the stream's last lines may come after the state event that ended the job)
        expect(browser_page.locator("#log-lines .line").last).to_have_text("deployed", timeout=15_000)
        # What the action answered is still said after the panel followed the job to its end
        expect(browser_page.locator("#action-result")).to_have_text("Approve: done")
        # And "Rerun from this stage" on deploy starts a new job from deploy
        browser_page.locator("tr[data-stage=deploy]").get_by_role(
            "button", name="Rerun from this stage"
        ).click()
        browser_page.wait_for_url(re.compile(r"/jobs/(?!" + re.escape(job_id) + r")[^/]+$"), timeout=30_000)
        rerun_id = browser_page.url.rsplit("/", 1)[-1]
        rerun = operator_api.get_job(rerun_id)
        assert (rerun["retry_of"], rerun["from_stage"]) == (job_id, "deploy")
        assert [s["status"] for s in rerun["stages"]][0] == "skipped"


def test_cancel_a_running_job_with_the_button(operator_api, browser_page):
    project_id = _project(
        operator_api, [{"name": "build", "run": "echo started; sleep 120", "kill_grace_sec": 1}]
    )
    job_id = _run(operator_api, project_id)
    with console_server(operator_api) as server:
        _open(browser_page, server, f"/jobs/{job_id}")
        browser_page.locator("#log-lines .line", has_text="started").wait_for(timeout=60_000)
        browser_page.get_by_role("button", name="Cancel job").click()
        job = _wait_job(operator_api, job_id, lambda job: job["status"] in ENDED, timeout=60)
        assert job["status"] == "canceled", job
        browser_page.locator("#connection", has_text="ended (canceled)").wait_for(timeout=30_000)
        # The panel is fetched again on the state event, which may land after the stream's end.
        cancel = browser_page.get_by_role("button", name="Cancel job")
        expect(cancel).to_have_attribute("title", "the job already ended (canceled)", timeout=30_000)
        expect(cancel).to_be_disabled()


def test_download_an_artifact_and_check_its_sha256(operator_api, browser_page, tmp_path: Path):
    body = secrets.token_hex(4096)
    project_id = _project(
        operator_api, [{"name": "build", "run": f'printf %s {body} > "$RELEVO_ARTIFACT_DIR/app.bin"'}]
    )
    job_id = _run(operator_api, project_id)
    job = _wait_job(operator_api, job_id, lambda job: job["status"] in ENDED)
    assert job["status"] == "succeeded", job
    with console_server(operator_api) as server:
        _open(browser_page, server, f"/jobs/{job_id}")
        with browser_page.expect_download(timeout=30_000) as download:
            browser_page.get_by_role("link", name="Download").click()
        saved = tmp_path / "app.bin"
        download.value.save_as(saved)
    digest = hashlib.sha256(saved.read_bytes()).hexdigest()
    assert digest == hashlib.sha256(body.encode()).hexdigest()
    assert digest == job["artifacts"][0]["sha256"]


def test_a_view_only_user_sees_disabled_buttons_with_their_reasons(
    operator_api, browser_page, console_stack, screenshots
):
    project_id = _project(operator_api, TWO_STAGES, **GATED)
    viewer = iam_user(console_stack, f"viewer-{secrets.token_hex(3)}")
    operator_api.grant(project_id, viewer.arn, "view")
    job_id = _run(operator_api, project_id)
    _wait_job(operator_api, job_id, lambda job: job["status"] == "waiting")
    with console_server(viewer.api) as server:
        _open(browser_page, server, f"/jobs/{job_id}")
        for name, needs in (
            ("Approve", "operate"),
            ("Reject", "operate"),
            ("Cancel job", "manage"),
            ("Rerun", "manage"),
        ):
            button = browser_page.get_by_role("button", name=name, exact=True)
            assert button.is_disabled(), name
            assert (
                button.get_attribute("title")
                == f"{viewer.arn} has view on project {project_id}; {name} needs {needs}"
            )
        _screenshot(browser_page, screenshots, "job-view-only")
    assert operator_api.get_job(job_id)["status"] == "waiting"
    operator_api.cancel_job(job_id)


class _AttackerPage(BaseHTTPRequestHandler):
    """Another origin on this machine (127.0.0.1, another port: the same *site*, so a SameSite
    cookie alone would go with its requests): its script POSTs an approve to the console."""

    target = ""

    def do_GET(self) -> None:  # noqa: N802
        page = (
            "<!doctype html><title>cute cats</title><script>"
            f"fetch({self.target!r}, "
            f"{{method: 'POST', mode: 'no-cors', credentials: 'include', body: '{{}}'}})"
            ".then(() => document.title = 'sent', () => document.title = 'sent');"
            "</script>"
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(page)))
        self.end_headers()
        self.wfile.write(page)

    def log_message(self, *_args: Any) -> None:
        pass


@pytest.fixture()
def attacker_site() -> Iterator[tuple[ThreadingHTTPServer, type[_AttackerPage]]]:
    handler = type("AttackerPage", (_AttackerPage,), {})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server, handler
    finally:
        server.shutdown()
        server.server_close()


def test_a_cross_origin_post_to_approve_is_refused_and_writes_nothing(
    operator_api, browser_page, attacker_site
):
    project_id = _project(operator_api, TWO_STAGES, **GATED)
    job_id = _run(operator_api, project_id)
    _wait_job(operator_api, job_id, lambda job: job["status"] == "waiting")
    attacker, handler = attacker_site
    with console_server(operator_api) as server:
        handler.target = f"{server.origin}/jobs/{job_id}/actions/approve"
        refusals: list[int] = []
        browser_page.on(
            "response",
            lambda response: refusals.append(response.status) if "/actions/" in response.url else None,
        )
        # The operator is signed in to the console (the cookie is in this browser)...
        _open(browser_page, server, f"/jobs/{job_id}")
        # ...and opens the attacker's page in the same browser
        browser_page.goto(f"http://127.0.0.1:{attacker.server_address[1]}/")
        browser_page.wait_for_function("document.title === 'sent'", timeout=15_000)
        wait_until(lambda: refusals, 10, "the attacker's request answered")
        assert refusals == [403]
        # A rebound name (attacker.example resolving to 127.0.0.1) is refused too
        cookies = {c["name"]: c["value"] for c in browser_page.context.cookies(server.origin)}
        rebound = requests.get(
            f"{server.origin}/jobs/{job_id}",
            headers={"Host": f"attacker.example:{server.port}"},
            cookies=cookies,
            timeout=10,
        )
        assert rebound.status_code == 400
        assert requests.get(f"{server.origin}/jobs/{job_id}", cookies=cookies, timeout=10).status_code == 200
    # Nothing was written: the job still waits at its gate, and no one answered it
    job = operator_api.get_job(job_id)
    assert (job["status"], job["approval_decision"]) == ("waiting", None)
    operator_api.cancel_job(job_id)


def test_the_run_page_starts_a_job_with_two_stages_ticked_on_a_listed_branch(
    operator_api, browser_page, tmp_path
):
    # Given a project of three stages whose repository has a release branch and a tag
    stages = [
        {"name": "build", "run": "echo build"},
        {"name": "sign", "run": "echo sign"},
        {"name": "deploy", "run": "echo deploy"},
    ]
    project_id = _project(operator_api, stages)
    git_remote(tmp_path / "git", f"acme/{project_id}", ("main", "release/4.2"), ("v4.2.0",))
    with console_server(operator_api, git_base_url=f"file://{tmp_path / 'git'}") as server:
        _open(browser_page, server, f"/run?project={project_id}")
        # The refs come from `git ls-remote` of the operator
        browser_page.locator("#run-refs-state", has_text="branches and tags").wait_for(timeout=30_000)
        listed = browser_page.locator("#run-refs option").evaluate_all("options => options.map(o => o.value)")
        assert sorted(listed) == ["main", "release/4.2", "v4.2.0"]
        build, sign, deploy = (
            browser_page.get_by_role("checkbox", name=name) for name in ("build", "sign", "deploy")
        )
        # Unticking the first stage unticks the later ones; ticking sign ticks build again: no gaps
        build.uncheck()
        assert not sign.is_checked() and not deploy.is_checked()
        sign.check()
        assert build.is_checked() and sign.is_checked() and not deploy.is_checked()
        browser_page.get_by_label("Branch or tag").fill("release/4.2")
        browser_page.get_by_label("Priority").fill("30")
        browser_page.get_by_role("button", name="Run", exact=True).click()
        link = browser_page.locator("#run-job")
        link.wait_for(timeout=30_000)
        job_id = link.inner_text()
    job = operator_api.get_job(job_id)
    assert [s["name"] for s in job["stages"]] == ["build", "sign"]
    assert (job["ref"], job["priority"], job["trigger"]["type"]) == ("release/4.2", 30, "manual")


def test_the_queue_page_promotes_reprioritises_and_cancels(operator_api, browser_page, screenshots):
    # Given a project busy with one long job and two more queued behind it (project_running)
    project_id = _project(operator_api, [{"name": "build", "run": "sleep 60", "kill_grace_sec": 1}])
    running = _run(operator_api, project_id)
    _wait_job(operator_api, running, lambda job: job["status"] == "running")
    first, second = _run(operator_api, project_id), _run(operator_api, project_id)
    try:
        with console_server(operator_api) as server:
            _open(browser_page, server, "/queue")
            rows = browser_page.locator("table.queue tbody tr[data-job-id]")
            assert browser_page.locator("#queue-count").inner_text() == str(rows.count())
            assert browser_page.locator("#oldest-wait").inner_text() not in ("", "—")
            _screenshot(browser_page, screenshots, "queue")
            # When the second is promoted, it runs next
            with browser_page.expect_navigation():
                browser_page.locator(f"tr[data-job-id='{second}']").get_by_role(
                    "button", name="Promote"
                ).click()
            wait_until(
                lambda: [j["job_id"] for j in operator_api.queue()["jobs"] if j["job_id"] in (first, second)]
                == [second, first],
                15,
                "promoted",
            )
            # And a new priority and a cancel from the queue page are the API's
            row = browser_page.locator(f"tr[data-job-id='{first}']")
            row.get_by_label("Priority").fill("7")
            with browser_page.expect_navigation():
                row.get_by_role("button", name="Set priority").click()
            wait_until(lambda: operator_api.get_job(first)["priority"] == 7, 15, "priority set")
            browser_page.locator(f"tr[data-job-id='{first}']").get_by_role(
                "button", name="Cancel job"
            ).click()
            _wait_job(operator_api, first, lambda job: job["status"] == "canceled", timeout=30)
    finally:
        for job_id in (running, first, second):
            if operator_api.get_job(job_id)["status"] not in ENDED:
                operator_api.cancel_job(job_id)


def test_the_dlq_page_redrives_a_failed_job_and_the_fleet_page_shows_the_agent(
    operator_api, browser_page, tmp_path
):
    # Given a job whose stage fails for good on its first run (exit 1 is not retryable)
    marker = tmp_path / "failed-once"
    project_id = _project(
        operator_api,
        [
            {"name": "build", "run": "echo ok"},
            {"name": "sign", "run": f"[ -f {marker} ] || {{ touch {marker}; exit 1; }}; echo signed"},
        ],
    )
    job_id = _run(operator_api, project_id)
    assert _wait_job(operator_api, job_id, lambda job: job["status"] in ENDED)["status"] == "failed"
    wait_until(
        lambda: any(e["job_id"] == job_id for e in operator_api.dead_letters()["entries"]),
        60,
        "the DLQ entry",
    )
    with console_server(operator_api) as server:
        _open(browser_page, server, "/dlq")
        row = browser_page.locator("table.dlq tr", has=browser_page.get_by_role("link", name=job_id))
        assert row.locator("td").nth(2).inner_text() == "sign"  # the failed stage
        assert row.locator("td").nth(5).inner_text() == "build"  # the last good stage
        # When it is redriven from the page, a new job resumes it from sign and succeeds
        with browser_page.expect_navigation():
            row.get_by_role(
                "button", name="Redrive", exact=True
            ).click()  # its accessible name, as the issue names it
        others = wait_until(
            lambda: [
                j["job_id"]
                for j in operator_api.list_jobs(project=project_id)["jobs"]
                if j["job_id"] != job_id
            ],
            30,
            "the redriven job",
        )
        redriven = _wait_job(operator_api, others[0], lambda job: job["status"] in ENDED)
        assert (redriven["status"], redriven["retry_of"], redriven["from_stage"]) == (
            "succeeded",
            job_id,
            "sign",
        )
        _open(browser_page, server, "/fleet")
        agent = browser_page.locator("table.agents tr", has_text="console-mac")
        assert "online" in agent.inner_text() and "/ 2" in agent.inner_text()
        # And the nav reaches the deliveries page, which shows the deliveries table
        with browser_page.expect_navigation():
            browser_page.get_by_role("navigation", name="Console").get_by_role(
                "link", name="Deliveries", exact=True
            ).click()
        assert browser_page.url == server.origin + "/deliveries"
        assert browser_page.get_by_role("heading", level=1).inner_text().startswith("Deliveries")
        assert browser_page.locator("table.deliveries").count() == 1


def test_the_page_opens_on_the_logs_end_and_load_earlier_joins_it_with_no_gap(operator_api, browser_page):
    # Given 3,000 lines printed in six bursts, so the agent stores them as several chunks
    command = (
        'for b in 0 1 2 3 4 5; do for i in $(seq 1 500); do printf "n %d %0150d\\n" $((b * 500 + i)) '
        "0; done; sleep 0.7; done"
    )
    project_id = _project(operator_api, [{"name": "build", "run": command}])
    job_id = _run(operator_api, project_id)
    assert _wait_job(operator_api, job_id, lambda job: job["status"] in ENDED)["status"] == "succeeded"
    chunks = operator_api.job_logs(job_id, from_seq=0, limit=1000)["chunks"]
    assert len(chunks) >= 3, len(chunks)
    expected = [f"n {i} {0:0150d}" for i in range(1, 3001)]
    with console_server(operator_api) as server:
        _open(browser_page, server, f"/jobs/{job_id}")
        browser_page.locator("#connection", has_text="ended").wait_for(timeout=30_000)
        # The page opens on the end of the log (at least the last 200 lines, whole chunks)
        shown = _lines(browser_page)
        assert 200 <= len(shown) < 3000 and shown == expected[-len(shown) :]
        earlier = browser_page.get_by_role("button", name="Load earlier")
        assert earlier.is_enabled()
        while earlier.is_enabled():
            count = len(_lines(browser_page))
            earlier.click()
            wait_until(
                lambda count=count: len(_lines(browser_page)) > count or earlier.is_disabled(),
                15,
                "earlier lines",
            )
        # Then the whole log is there once, in order
        assert _lines(browser_page) == expected


# The order in which the page replaced its panel and said the stream ended, and whether its stream
# got `done` (a listener on every EventSource the page makes, ahead of the page's own).
RECORD_PANEL_AND_ENDING = """() => {
  window.relevoOrder = [];
  window.relevoStreamDone = false;
  const Native = window.EventSource;
  window.EventSource = function (url, init) {
    const source = new Native(url, init);
    source.addEventListener("done", function () { window.relevoStreamDone = true; });
    return source;
  };
  new MutationObserver(function (records) {
    for (const record of records) {
      // A refresh replaces the children the page was parsed with (parsing only adds them).
      if (record.target.id === "job-panel" && record.removedNodes.length) window.relevoOrder.push("panel");
      if (record.target.id === "connection" && record.target.textContent.startsWith("ended")) {
        window.relevoOrder.push("ended");
      }
    }
  }).observe(document, { childList: true, subtree: true });
}"""


@SECOND_GROUP
def test_ended_shows_after_the_last_panel_refresh_however_the_answers_arrive(operator_api, browser_page):
    # Given an ended job, and a page whose first panel refresh (the stream's first state) is held
    # until the stream said `done`, so that the `done` event's refresh could overtake it
    project_id = _project(operator_api, [{"name": "build", "run": "echo built"}])
    job_id = _run(operator_api, project_id)
    assert _wait_job(operator_api, job_id, lambda job: job["status"] in ENDED)["status"] == "succeeded"
    held: list[Any] = []
    asked: list[str] = []
    browser_page.on(
        "request", lambda request: asked.append(request.url) if request.url.endswith("/panel") else None
    )
    browser_page.route("**/panel", lambda route: held.append(route) if not held else route.continue_())
    browser_page.add_init_script(script=f"({RECORD_PANEL_AND_ENDING})()")
    with console_server(operator_api) as server:
        _open(browser_page, server, f"/jobs/{job_id}")
        browser_page.wait_for_function("() => window.relevoStreamDone === true", timeout=30_000)
        # The route's callback reaches this process while Playwright is being called, and can come
        # after the flag (CI: none held yet): each evaluate lets the held refresh arrive.
        wait_until(lambda: browser_page.evaluate("1") and held, 15, "the first panel refresh held")
        # When the held answer comes last
        held[0].continue_()
        connection = browser_page.locator("#connection")
        expect(connection).to_have_text("ended (succeeded)", timeout=30_000)
        wait_until(
            lambda: browser_page.evaluate("window.relevoOrder.filter(e => e === 'panel').length")
            == len(asked),
            15,
            f"every panel refresh asked for ({asked}) to land",
        )
        # Then "ended" came once every refresh had landed: what the page shows then is final
        order = browser_page.evaluate("window.relevoOrder")
        assert order.count("panel") >= 2 and order[-1] == "ended", order


# Every DOM change, the most log lines the page held (a MutationObserver's callback runs after the
# script that changed the DOM: what a reader could ever see).
COUNT_LOG_LINES = """() => {
  window.relevoMostLines = 0;
  new MutationObserver(function () {
    const log = document.getElementById("log-lines");
    if (log) window.relevoMostLines = Math.max(window.relevoMostLines, log.childElementCount);
  }).observe(document, { childList: true, subtree: true });
}"""


def _kept_lines(page) -> int:
    """How many output lines the page keeps now: LOG_MAX_LINES places, less those the end banners
    shown take (an end banner is not a `.line`, but it is one of the log's kept elements)."""
    return LOG_MAX_LINES - page.locator("#log-lines .banner").count()


def _numbered(page) -> list[int]:
    """The log lines shown, each a number (`seq` printed them), checked to follow one another."""
    shown = [int(line) for line in _lines(page)]
    assert shown == list(range(shown[0], shown[0] + len(shown))), "a gap or a repeat in the lines shown"
    return shown


def test_lines_trimmed_past_the_cap_come_back_with_load_earlier_with_no_gap_or_repeat(
    operator_api, browser_page
):
    # Given a log of 1,000 lines more than the page keeps, printed by `seq` in bursts of 750 (a
    # chunk each, or so: the cap falls inside one)
    total, burst = LOG_MAX_LINES + 1000, 750
    command = (
        f"for b in $(seq 0 {total // burst - 1}); do seq $((b * {burst} + 1)) $((b * {burst} + "
        f"{burst})); sleep 0.3; done"
    )
    project_id = _project(operator_api, [{"name": "build", "run": command}])
    job_id = _run(operator_api, project_id)
    assert _wait_job(operator_api, job_id, lambda job: job["status"] in ENDED)["status"] == "succeeded"
    browser_page.add_init_script(script=f"({COUNT_LOG_LINES})()")
    with console_server(operator_api) as server:
        # When the page streams the whole log (from seq 0), the oldest lines are trimmed
        _open(browser_page, server, f"/jobs/{job_id}?from_seq=0")
        browser_page.locator("#connection", has_text="ended").wait_for(timeout=60_000)
        # (the stage's end banner, after its last line, takes one of the places the page keeps)
        assert _numbered(browser_page) == list(range(total - _kept_lines(browser_page) + 1, total + 1))
        earlier = browser_page.get_by_role("button", name="Load earlier")
        expect(earlier).to_be_enabled()
        first_line = browser_page.locator("#log-lines .line").first
        # Then "Load earlier" brings back the lines just before the first one shown, each press,
        # the newest giving way so the page never holds more than it keeps
        presses = 0
        while earlier.is_enabled():  # read once a press's lines are in: the same script set both
            before = _numbered(browser_page)
            earlier.click()
            presses += 1
            expect(first_line).not_to_have_text(str(before[0]), timeout=15_000)
            shown = _numbered(browser_page)
            assert shown[0] < before[0] and len(shown) <= LOG_MAX_LINES
        assert presses >= 1 and _numbered(browser_page) == list(range(1, _kept_lines(browser_page) + 1))
        expect(earlier).to_have_attribute("title", "the log starts here")
        expect(browser_page.locator("#connection")).to_have_text(re.compile("^paused"))
        # And Reconnect follows the end again from the first line no longer shown: trimmed anew,
        # and loaded back again, with no gap or repeat either way
        browser_page.get_by_role("button", name="Reconnect").click()
        browser_page.locator("#connection", has_text="ended").wait_for(timeout=60_000)
        assert _numbered(browser_page) == list(range(total - _kept_lines(browser_page) + 1, total + 1))
        earlier.click()
        expect(first_line).to_have_text("1", timeout=15_000)
        assert _numbered(browser_page) == list(range(1, _kept_lines(browser_page) + 1))
        assert browser_page.evaluate("() => window.relevoMostLines") == LOG_MAX_LINES


def test_the_run_page_filters_by_group_and_runs_two_stages_from_a_stage_with_a_priority(
    operator_api, browser_page, tmp_path, screenshots
):
    # Given two project groups, the selected project in the first, and in the second a project
    # whose long build holds it (a job run of build alone), so the next job queues behind it
    first_group, second_group = (f"team-{secrets.token_hex(3)}" for _ in range(2))
    stages = [
        {"name": "build", "run": "sleep 60", "kill_grace_sec": 1},
        {"name": "sign", "run": "echo signed"},
        {"name": "deploy", "run": "echo deployed"},
    ]
    mobile = _project(operator_api, TWO_STAGES, group=first_group)
    desktop = _project(operator_api, stages, group=second_group)
    tools = _project(operator_api, TWO_STAGES, group=second_group)
    git_remote(tmp_path / "git", f"acme/{desktop}", ("main", "release/5.0"), ("v5.0.0",))
    holder = operator_api.run_project(desktop, {"ref": "main", "stages": ["build"]})["job_id"]
    _wait_job(operator_api, holder, lambda job: job["status"] == "running")
    started: list[str] = []
    try:
        with console_server(operator_api, git_base_url=f"file://{tmp_path / 'git'}") as server:
            _open(browser_page, server, f"/run?project={mobile}")
            picker = browser_page.get_by_label("Project")
            assert picker.input_value() == mobile
            # When the group filter leaves the selected project out, the first project left is selected
            with browser_page.expect_navigation():
                browser_page.get_by_label("Group").select_option(second_group)
            expect(picker).to_have_value(min(desktop, tools), timeout=15_000)
            listed = picker.locator("option").evaluate_all("options => options.map(o => o.value)")
            assert sorted(listed) == sorted([desktop, tools])
            # Picking a project opens its run page: wait for that page, or what follows would act
            # on the page being left
            with browser_page.expect_navigation():
                picker.select_option(desktop)
            expect(picker).to_have_value(desktop, timeout=15_000)
            # And from-stage sign with deploy ticked asks for those two stages, at priority 25
            browser_page.get_by_label("From stage").select_option("sign")
            build, sign, deploy = (
                browser_page.get_by_role("checkbox", name=name) for name in ("build", "sign", "deploy")
            )
            expect(build).to_be_disabled()
            expect(build).not_to_be_checked()
            expect(sign).to_be_checked()
            expect(deploy).to_be_checked()
            browser_page.get_by_label("Priority").fill("25")
            browser_page.locator("#run-refs-state", has_text="branches and tags").wait_for(timeout=30_000)
            _screenshot(browser_page, screenshots, "run-page")
            browser_page.get_by_role("button", name="Run", exact=True).click()
            link = browser_page.locator("#run-job")
            link.wait_for(timeout=30_000)
            started.append(link.inner_text())
            # The answer is the job and its place in the queue, as the API's queue has it
            position = next(
                j["queue_position"] for j in operator_api.queue()["jobs"] if j["job_id"] == started[0]
            )
            assert (
                browser_page.locator("#run-result").inner_text()
                == f"Job {started[0]} queued (position {position} in the queue)"
            )
        job = operator_api.get_job(started[0])
        assert ([s["name"] for s in job["stages"]], job["priority"], job["from_stage"]) == (
            ["sign", "deploy"],
            25,
            None,
        )
        # Then, once the build holding the project is canceled, the job runs sign and deploy
        operator_api.cancel_job(holder)
        job = _wait_job(operator_api, started[0], lambda job: job["status"] in ENDED)
        assert job["status"] == "succeeded", job
        assert [s["status"] for s in job["stages"]] == ["succeeded", "succeeded"]
        text = "".join(
            chunk["text"] for chunk in operator_api.job_logs(started[0], from_seq=0, limit=100)["chunks"]
        )
        assert text.splitlines() == ["signed", "deployed"]
    finally:
        for job_id in (holder, *started):
            if operator_api.get_job(job_id)["status"] not in ENDED:
                operator_api.cancel_job(job_id)


def _rows(page) -> list[str]:
    return page.locator("table.jobs tbody tr[data-job-id]").evaluate_all(
        "rows => rows.map(r => r.dataset.jobId)"
    )


def test_the_job_list_filters_by_keyword_and_group_and_reruns_a_row_from_its_current_stage(
    operator_api, browser_page
):
    # Given two groups' projects, each with a job that failed at sign (build succeeded), one of
    # them on a release branch whose name only it carries
    first_group, second_group = (f"team-{secrets.token_hex(3)}" for _ in range(2))
    stages = [{"name": "build", "run": "echo built"}, {"name": "sign", "run": "exit 1"}]
    apps = _project(operator_api, stages, group=first_group)
    tools = _project(operator_api, stages, group=second_group)
    keyword = f"kw{secrets.token_hex(3)}"
    tagged = operator_api.run_project(apps, {"ref": f"release/{keyword}", "commit": random_commit()})[
        "job_id"
    ]
    plain = _run(operator_api, apps)
    other = _run(operator_api, tools)
    for job_id in (tagged, plain, other):
        assert _wait_job(operator_api, job_id, lambda job: job["status"] in ENDED)["status"] == "failed"
    with console_server(operator_api) as server:
        _open(browser_page, server, "/")
        # When the list is filtered by a keyword (part of the ref) and the group, it is the API's answer
        browser_page.get_by_label("Keyword").fill(keyword.upper())
        browser_page.get_by_label("Group").select_option(first_group)
        with browser_page.expect_navigation():
            browser_page.get_by_role("button", name="Filter").click()
        assert _rows(browser_page) == [tagged]
        assert f"q={keyword.upper()}" in browser_page.url and f"group={first_group}" in browser_page.url
        # The group alone: its two jobs, newest first, none of the other group's
        browser_page.get_by_label("Keyword").fill("")
        with browser_page.expect_navigation():
            browser_page.get_by_role("button", name="Filter").click()
        assert _rows(browser_page) == [j["job_id"] for j in operator_api.list_jobs(group=first_group)["jobs"]]
        assert sorted(_rows(browser_page)) == sorted([tagged, plain])
        # A time range that ends before they were created: none (`until` of GET /jobs)
        browser_page.get_by_label("Until (UTC)").fill("2020-01-01T00:00")
        with browser_page.expect_navigation():
            browser_page.get_by_role("button", name="Filter").click()
        assert _rows(browser_page) == [] and "until=2020-01-01T00%3A00" in browser_page.url
        browser_page.get_by_label("Until (UTC)").fill("")
        with browser_page.expect_navigation():
            browser_page.get_by_role("button", name="Filter").click()
        # A row's buttons (in its Actions menu) follow its state: a failed job cannot be approved or
        # promoted, and says why
        row = browser_page.locator(f"tr[data-job-id='{tagged}']")
        row.locator("details.menu > summary").click()
        approve = row.get_by_role("button", name="Approve", exact=True)
        assert (
            approve.is_disabled()
            and approve.get_attribute("title") == "only when the job is waiting at its gate (it is failed)"
        )
        assert (
            row.get_by_role("button", name="Promote").get_attribute("title")
            == "only when the job is queued (it is failed)"
        )
        assert row.get_by_role("link", name=tagged).get_attribute("href") == f"/jobs/{tagged}"
        # And "Rerun from the current stage" starts a job from sign, the stage it stopped at
        rerun = row.get_by_role("button", name="Rerun from the current stage")
        assert rerun.get_attribute("data-from-stage") == "sign"
        rerun.click()
        browser_page.wait_for_url(re.compile(r"/jobs/(?!" + re.escape(tagged) + r")[^/?]+$"), timeout=30_000)
    rerun_job = operator_api.get_job(browser_page.url.rsplit("/", 1)[-1])
    assert (rerun_job["retry_of"], rerun_job["from_stage"]) == (tagged, "sign")
    _wait_job(operator_api, rerun_job["job_id"], lambda job: job["status"] in ENDED)


def _summary(page) -> dict[str, str]:
    """The job page's summary as {term: value}."""
    return page.locator(".summary dl").evaluate(
        "dl => Object.fromEntries([...dl.querySelectorAll('dt')].map(dt => [dt.textContent.trim(), "
        "dt.nextElementSibling.textContent.trim()]))"
    )


def _exact(page, term: str) -> str:
    """The exact time a summary entry shows on hover (its <time>'s title)."""
    return (
        page.locator(".summary dl dt", has_text=re.compile(f"^{term}$"))
        .locator("xpath=following-sibling::dd[1]/time")
        .get_attribute("title")
    )


def test_the_job_summary_shows_who_ran_it_where_it_stands_its_steps_and_the_queue_place(
    operator_api, browser_page
):
    # Given a job whose build uploaded a 5,000-byte artifact and whose deploy still runs, and a
    # second job of the project queued behind it (project_running)
    stages = [
        {"name": "build", "run": 'head -c 5000 /dev/zero > "$RELEVO_ARTIFACT_DIR/app.bin"; echo built'},
        {"name": "deploy", "run": "echo deploying; sleep 60", "kill_grace_sec": 1},
    ]
    project_id = _project(operator_api, stages)
    running = _run(operator_api, project_id)
    _wait_job(
        operator_api,
        running,
        lambda job: job["current_stage"] == "deploy" and job["stages"][1]["status"] == "running",
    )
    queued = operator_api.run_project(project_id, {"ref": "main", "commit": random_commit(), "priority": 42})[
        "job_id"
    ]
    try:
        with console_server(operator_api) as server:
            _open(browser_page, server, f"/jobs/{running}")
            job = operator_api.get_job(running)
            summary = _summary(browser_page)
            assert summary["Macs"] == "console-mac (build, deploy)"
            assert summary["Trigger"] == f"api (api) by {job['trigger']['actor']}"
            assert (summary["Current stage"], summary["Progress"]) == ("deploy", "1 of 2 stages")
            # Times relative to now, the exact one (to the second, UTC) on hover
            assert re.fullmatch(r"just now|\d+ s ago|\d+ min ago", summary["Created"]), summary
            assert _exact(browser_page, "Created") == exact_time(job["created_at"])
            assert _exact(browser_page, "Started") == exact_time(job["stages"][0]["started_at"])
            assert summary["Ended"] == "—" and re.fullmatch(r"\d+s \(running\)", summary["Duration"]), summary
            # The cost so far, as GET /jobs/{id}/cost counts it from the execution's history
            cost = operator_api.job_cost(running)
            assert re.fullmatch(
                r"\$\d+\.\d{6}: \d+ transitions, \d+ Lambda invocations, \d+ DynamoDB and \d+ SQS requests",
                summary["Cost"],
            ), summary
            assert cost["transitions"] > 0 and cost["sqs_requests"] >= 2  # both stages were dispatched
            build = browser_page.locator("tr[data-stage=build]")
            assert build.locator("td.duration").inner_text().endswith("s")
            assert (
                build.locator("td.transfer").inner_text() == "1 file, 4.9 KiB uploaded"
            )  # the agent's last reading
            artifact = browser_page.locator("table.artifacts tbody tr", has_text="app.bin")
            assert artifact.locator("td.size").inner_text() == "5,000 bytes"
            assert artifact.locator("td.type").inner_text() == "file, application/octet-stream"
            # The queued job: its place in the queue (the API's), why it waits, its priority
            _open(browser_page, server, f"/jobs/{queued}")
            place = next(j for j in operator_api.queue()["jobs"] if j["job_id"] == queued)
            summary = _summary(browser_page)
            assert summary["Macs"] == "not dispatched yet"
            assert (summary["Queue position"], summary["Waiting"], summary["Priority"]) == (
                str(place["queue_position"]),
                "another job of its project is running: it starts when that one ends",
                "42",
            )
            assert summary["Started"] == "—"
            assert summary["Cost"].startswith("$")  # queued behind the lock: its execution runs already
    finally:
        for job_id in (running, queued):
            if operator_api.get_job(job_id)["status"] not in ENDED:
                operator_api.cancel_job(job_id)


PARTIAL = re.compile(r"^uploading ([1-5]) of 5 files, (.+) of 3\.8 MiB \((\d+) %\)$")


@SECOND_GROUP
def test_the_steps_show_a_stages_upload_live_then_its_totals_without_a_reload(
    operator_api, browser_page, screenshots
):
    # Given a stage that leaves 5 files of 768 KiB, uploaded by an agent at 128 KiB/s a file (s3transfer's
    # limiter lets bursts through: about 17 s)
    size = 768 * 1024
    assert 5 * size / UPLOAD_BYTES_PER_SEC >= 16  # long enough for several readings at one a renewal (3 s)
    make = (
        f'for i in 1 2 3 4 5; do head -c {size} /dev/urandom > "$RELEVO_ARTIFACT_DIR/part-$i.bin"; '
        "done; echo packaged"
    )
    project_id = _project(operator_api, [{"name": "package", "run": make}])
    with console_server(operator_api) as server:
        job_id = _run(operator_api, project_id)
        _open(browser_page, server, f"/jobs/{job_id}")
        browser_page.evaluate("() => { window.relevoOpenedOnce = true; }")  # gone if the page reloads
        cell = browser_page.locator("tr[data-stage=package] td.transfer")
        # When the upload is under way, the stage's cell says how far it got, reading after reading
        seen: list[str] = []

        api_readings: list[str] = []

        def partial_readings() -> bool:
            text = cell.inner_text()
            stage = operator_api.get_job(job_id)["stages"][0]
            api_readings.append(f"{stage['status']}: {stage['transfer']}")
            if PARTIAL.match(text) and text not in seen:
                seen.append(text)
                if len(seen) == 2:
                    _screenshot(browser_page, screenshots, "job-transfer-progress")
            return len(seen) >= 2 or text.endswith("uploaded")

        wait_until(partial_readings, 90, "two readings of the upload under way", interval=0.2)
        assert len(seen) >= 2, f"the page showed {seen} before the totals; the API said {api_readings}"
        percents = [int(PARTIAL.match(text).group(3)) for text in seen]
        assert percents == sorted(percents) and percents[-1] < 100, seen
        # Then the totals, on the same page (never reloaded)
        expect(cell).to_have_text("5 files, 3.8 MiB uploaded", timeout=60_000)
        assert browser_page.evaluate("() => window.relevoOpenedOnce === true")
        job = _wait_job(operator_api, job_id, lambda job: job["status"] in ENDED)
        assert job["status"] == "succeeded", job
        transfer = job["stages"][0]["transfer"]
        assert (transfer["state"], transfer["files_done"], transfer["bytes_done"]) == (
            "uploaded",
            5,
            5 * size,
        )
        assert [t["attempt"] for t in job["stages"][0]["transfers"]] == [1]
        browser_page.locator("#job-status", has_text="succeeded").wait_for(
            timeout=30_000
        )  # the panel follows the end
        _screenshot(browser_page, screenshots, "job-transfer-done")


# Every button the issue names, by its accessible name (Download is a link: it is a download).
NAMED_BUTTONS = ("Approve", "Reject", "Cancel job", "Rerun", "Rerun from this stage", "Promote", "Delete")


def _focused_name(page) -> str:
    return page.evaluate(
        "() => { const el = document.activeElement; return el ? (el.getAttribute('aria-label') || "
        "el.textContent || '').trim() : ''; }"
    )


@SECOND_GROUP
def test_approve_is_reached_and_pressed_with_the_keyboard_and_every_named_button_has_its_name(
    operator_api, browser_page
):
    project_id = _project(
        operator_api,
        [
            {"name": "build", "run": 'echo built > "$RELEVO_ARTIFACT_DIR/notes.txt"'},
            {"name": "deploy", "run": "echo deployed"},
        ],
        **GATED,
    )
    job_id = _run(operator_api, project_id)
    _wait_job(operator_api, job_id, lambda job: job["status"] == "waiting")
    # Streams cut every 1.5 s: each reconnect's first state event re-renders the panel
    with console_server(operator_api, lifetime_sec=1.5) as server:
        _open(browser_page, server, f"/jobs/{job_id}")
        for name in NAMED_BUTTONS:
            assert browser_page.get_by_role("button", name=name, exact=True).count() >= 1, name
        assert browser_page.get_by_role("link", name="Download", exact=True).count() == 1
        # Keyboard only: Tab to the reason and type it...
        for _ in range(40):
            browser_page.keyboard.press("Tab")
            if (
                browser_page.evaluate("() => document.activeElement && document.activeElement.id")
                == "action-reason"
            ):
                break
        else:
            raise AssertionError("Tab never reached the reason field")
        browser_page.keyboard.type("keyboard approval")
        # ...while the panel is re-rendered: the reason and the keyboard's place stay
        browser_page.wait_for_event(
            "response", lambda response: response.url.endswith("/panel"), timeout=15_000
        )
        browser_page.wait_for_timeout(200)
        assert browser_page.evaluate("() => document.activeElement.id") == "action-reason"
        # ...then Tab on to Approve and press Enter
        reached: list[str] = []
        for _ in range(10):
            browser_page.keyboard.press("Tab")
            reached.append(_focused_name(browser_page))
            if reached[-1] == "Approve":
                break
        assert reached[-1] == "Approve", reached
        browser_page.keyboard.press("Enter")
        job = _wait_job(operator_api, job_id, lambda job: job["status"] in ENDED)
    assert job["status"] == "succeeded", job
    assert (job["approval_decision"]["decision"], job["approval_decision"]["reason"]) == (
        "approved",
        "keyboard approval",
    )


@SECOND_GROUP
def test_a_masked_value_stays_masked_in_the_log_view_live_and_after_reload(operator_api, browser_page):
    # Given a stage that prints the secret the agent masks, then keeps running a while (the agent
    # holds back the last len(secret) - 1 characters it read, which may start a secret: the filler
    # line releases the first)
    filler = "-" * 64
    project_id = _project(
        operator_api,
        [
            {
                "name": "build",
                "run": f'echo "token=${SECRET_VARIABLE}"; echo {filler}; sleep 8; echo "again '
                f'${SECRET_VARIABLE} done"',
            }
        ],
        region_affinity=MASKING_REGION,
    )
    job_id = _run(operator_api, project_id)
    with console_server(operator_api) as server:
        _open(browser_page, server, f"/jobs/{job_id}")
        # Live: the line arrives masked while the stage runs
        browser_page.locator("#log-lines .line", has_text="token=").wait_for(timeout=60_000)
        assert operator_api.get_job(job_id)["status"] == "running"
        assert "token=******" in _lines(browser_page)
        _wait_job(operator_api, job_id, lambda job: job["status"] in ENDED)
        browser_page.locator("#connection", has_text="ended").wait_for(timeout=30_000)
        assert _lines(browser_page) == ["token=******", filler, "again ****** done"]
        assert SECRET_VALUE not in browser_page.content()
        # After a reload (the log's tail read back through the API): still masked
        browser_page.reload()
        browser_page.locator("#connection", has_text="ended").wait_for(timeout=30_000)
        assert _lines(browser_page) == ["token=******", filler, "again ****** done"]
        assert SECRET_VALUE not in browser_page.content()


@SECOND_GROUP
def test_a_directory_artifact_downloads_as_a_tar_gz_with_its_files_and_content_length(
    operator_api, browser_page, tmp_path: Path
):
    # Given a stage that leaves a directory (a nested one inside) and a file in its artifact dir
    body = secrets.token_hex(2048)
    make = (
        'mkdir -p "$RELEVO_ARTIFACT_DIR/App.app/Contents/MacOS"; '
        f'printf %s {body} > "$RELEVO_ARTIFACT_DIR/App.app/Contents/MacOS/App"; '
        'echo "<plist/>" > "$RELEVO_ARTIFACT_DIR/App.app/Contents/Info.plist"; echo notes > '
        '"$RELEVO_ARTIFACT_DIR/notes.txt"'
    )
    project_id = _project(operator_api, [{"name": "build", "run": make}])
    job_id = _run(operator_api, project_id)
    job = _wait_job(operator_api, job_id, lambda job: job["status"] in ENDED)
    assert job["status"] == "succeeded", job
    recorded = {a["name"]: a["sha256"] for a in job["artifacts"]}
    assert sorted(recorded) == ["App.app/Contents/Info.plist", "App.app/Contents/MacOS/App", "notes.txt"]
    with console_server(operator_api) as server:
        _open(browser_page, server, f"/jobs/{job_id}")
        row = browser_page.locator("table.artifacts tbody tr.directory", has_text="App.app/")
        assert row.locator("td.type").inner_text() == "directory (.tar.gz)"
        notes = browser_page.locator("table.artifacts tbody tr", has_text="notes.txt")
        assert notes.locator("td.type").inner_text() == "file, text/plain"
        # When its Download is pressed, the browser saves one .tar.gz (a native download)
        with browser_page.expect_download(timeout=30_000) as download:
            row.get_by_role("link", name="Download").click()
        assert download.value.suggested_filename == "App.app.tar.gz"
        saved = tmp_path / "App.app.tar.gz"
        download.value.save_as(saved)
        # The console answers it with its length (and the same archive every time)
        cookies = {c["name"]: c["value"] for c in browser_page.context.cookies(server.origin)}
        answer = requests.get(
            server.origin + row.get_by_role("link", name="Download").get_attribute("href"),
            cookies=cookies,
            timeout=30,
        )
    assert answer.status_code == 200 and answer.headers["Content-Type"] == "application/gzip"
    assert int(answer.headers["Content-Length"]) == len(answer.content) == saved.stat().st_size
    assert hashlib.sha256(answer.content).hexdigest() == hashlib.sha256(saved.read_bytes()).hexdigest()
    # Then the archive holds the directory's files, each with the sha256 the agent recorded
    import tarfile

    with tarfile.open(saved, "r:gz") as archive:
        members = {
            m.name: hashlib.sha256(archive.extractfile(m).read()).hexdigest()
            for m in archive.getmembers()
            if m.isfile()
        }
    assert members == {name: digest for name, digest in recorded.items() if name.startswith("App.app/")}
    assert members["App.app/Contents/MacOS/App"] == hashlib.sha256(body.encode()).hexdigest()


def _wait_for(marker: Path) -> str:
    """Shell that waits until the test creates `marker` (the agent runs on this machine)."""
    return f"while [ ! -e {marker} ]; do sleep 0.1; done"


@contextmanager
def _ended_after(api: RelevoApi, *job_ids: str) -> Iterator[None]:
    """Cancel each job not ended when the test is over (a failed check included), so that a stage
    left waiting holds none of the agent's slots for the tests after it."""
    try:
        yield
    finally:
        for job_id in job_ids:
            if api.get_job(job_id)["status"] not in ENDED:
                api.cancel_job(job_id)


def _at_bottom(page) -> bool:
    return page.locator("#log-lines").evaluate("el => el.scrollTop + el.clientHeight >= el.scrollHeight - 4")


def _line(page, text: str):
    return page.locator("#log-lines .line", has_text=re.compile(f"^{re.escape(text)}$"))


@SECOND_GROUP
def test_the_log_scrolls_along_only_while_the_reader_is_at_the_bottom(
    operator_api, browser_page, tmp_path: Path
):
    # Given a stage that prints 100 lines (more than the log area shows), then 100 more each time
    # the test lets it go on
    go = [tmp_path / f"go-{n}" for n in range(3)]
    command = "; ".join(
        [
            "seq 1 100",
            *(f"{_wait_for(marker)}; seq {n * 100 + 101} {n * 100 + 200}" for n, marker in enumerate(go)),
        ]
    )
    project_id = _project(operator_api, [{"name": "build", "run": command, "kill_grace_sec": 1}])
    job_id = _run(operator_api, project_id)
    with console_server(operator_api) as server, _ended_after(operator_api, job_id):
        _open(browser_page, server, f"/jobs/{job_id}")
        _line(browser_page, "100").wait_for(timeout=60_000)
        assert _at_bottom(browser_page)
        # When lines arrive while the reader is at the bottom, the log scrolls along
        go[0].touch()
        _line(browser_page, "200").wait_for(timeout=30_000)
        assert _at_bottom(browser_page)
        # When the reader scrolled up, lines arriving leave the view where the reader put it
        log = browser_page.locator("#log-lines")
        log.evaluate("el => { el.scrollTop = 40; }")
        go[1].touch()
        _line(browser_page, "300").wait_for(timeout=30_000)
        assert log.evaluate("el => el.scrollTop") == 40 and not _at_bottom(browser_page)
        # And back at the bottom, it scrolls along again
        log.evaluate("el => { el.scrollTop = el.scrollHeight; }")
        go[2].touch()
        _line(browser_page, "400").wait_for(timeout=30_000)
        assert _at_bottom(browser_page)


@SECOND_GROUP
def test_the_log_controls_full_screen_clear_and_reconnect(operator_api, browser_page, tmp_path: Path):
    # Given a stage that prints three lines, then three more and three more when the test lets it
    first, second = tmp_path / "first", tmp_path / "second"
    lines = {part: [f"{part} {i}" for i in (1, 2, 3)] for part in "abc"}
    printing = {part: f'for i in 1 2 3; do echo "{part} $i"; done' for part in "abc"}
    command = f"{printing['a']}; {_wait_for(first)}; {printing['b']}; {_wait_for(second)}; {printing['c']}"
    project_id = _project(operator_api, [{"name": "build", "run": command, "kill_grace_sec": 1}])
    job_id = _run(operator_api, project_id)
    with console_server(operator_api) as server, _ended_after(operator_api, job_id):
        _open(browser_page, server, f"/jobs/{job_id}")
        connection = browser_page.locator("#connection")
        _line(browser_page, "a 3").wait_for(timeout=60_000)
        expect(connection).to_have_text("live")
        # Full screen shows the log area alone; pressed again, it leaves full screen
        full_screen = browser_page.get_by_role("button", name="Full screen", exact=True)
        full_screen.click()
        browser_page.wait_for_function(
            "() => document.fullscreenElement !== null && document.fullscreenElement.matches('section.log')"
        )
        full_screen.click()
        browser_page.wait_for_function("() => document.fullscreenElement === null")
        # Clear empties the view; lines printed later still arrive, and Load earlier brings back
        # what was cleared
        browser_page.get_by_role("button", name="Clear", exact=True).click()
        expect(browser_page.locator("#log-lines .line")).to_have_count(0)
        first.touch()
        _line(browser_page, "b 3").wait_for(timeout=30_000)
        assert _lines(browser_page) == lines["b"]
        browser_page.get_by_role("button", name="Load earlier").click()
        expect(browser_page.locator("#log-lines .line").first).to_have_text("a 1", timeout=15_000)
        assert _lines(browser_page) == lines["a"] + lines["b"]
        # Reconnect opens a new stream from the seq after the last chunk shown: nothing missed or repeated
        shown_up_to = operator_api.job_logs(job_id, from_seq=0, limit=100)["chunks"][-1]["seq"]
        with browser_page.expect_request(lambda request: "/stream?" in request.url) as reconnect:
            browser_page.get_by_role("button", name="Reconnect", exact=True).click()
        assert re.search(r"from_seq=(\d+)", reconnect.value.url).group(1) == str(shown_up_to + 1)
        expect(connection).to_have_text("live", timeout=15_000)
        second.touch()
        expect(connection).to_have_text("ended (succeeded)", timeout=60_000)
        assert _lines(browser_page) == lines["a"] + lines["b"] + lines["c"]


@SECOND_GROUP
def test_reject_at_the_gate_on_the_job_page_writes_the_rejection_with_its_reason(operator_api, browser_page):
    project_id = _project(operator_api, TWO_STAGES, **GATED)
    job_id = _run(operator_api, project_id)
    _wait_job(operator_api, job_id, lambda job: job["status"] == "waiting")
    with console_server(operator_api) as server, _ended_after(operator_api, job_id):
        _open(browser_page, server, f"/jobs/{job_id}")
        reject = browser_page.get_by_role("button", name="Reject", exact=True)
        expect(reject).to_be_enabled(timeout=15_000)
        # Without a reason, nothing is sent: the page asks for one
        reject.click()
        expect(browser_page.locator("#action-result")).to_have_text("Reject needs a reason.")
        assert operator_api.get_job(job_id)["status"] == "waiting"
        # With one, the API records the rejection, its reason and who rejected, and deploy never runs
        browser_page.get_by_label("Reason").fill("crash on launch in 4.2 RC")
        reject.click()
        job = _wait_job(operator_api, job_id, lambda job: job["status"] in ENDED)
        decision = job["approval_decision"]
        assert (decision["decision"], decision["reason"]) == ("rejected", "crash on launch in 4.2 RC"), (
            decision
        )
        assert decision["actor"] == operator_api.session.client("sts").get_caller_identity()["Arn"]
        assert [stage["status"] for stage in job["stages"]][1] != "succeeded"
        # The panel follows: the status the API gives, and the gate answered as it says
        expect(browser_page.locator("#job-status")).to_have_text(job["status"], timeout=30_000)
        expect(browser_page.locator(".summary dl")).to_contain_text(
            f"rejected by {decision['actor']}: crash on launch in 4.2 RC"
        )


@SECOND_GROUP
def test_promote_on_the_job_page_puts_the_queued_job_first(operator_api, browser_page):
    # Given a project busy with a long job and two more queued behind it (project_running)
    project_id = _project(operator_api, [{"name": "build", "run": "sleep 60", "kill_grace_sec": 1}])
    running = _run(operator_api, project_id)
    _wait_job(operator_api, running, lambda job: job["status"] == "running")
    first, second = _run(operator_api, project_id), _run(operator_api, project_id)
    with _ended_after(operator_api, running, first, second), console_server(operator_api) as server:
        _open(browser_page, server, f"/jobs/{second}")
        queued = {job["job_id"]: job for job in operator_api.queue()["jobs"]}
        assert queued[first]["queue_position"] < queued[second]["queue_position"]
        # When Promote is pressed, the API gives the job the highest queued priority + 1...
        promoted = max(job["priority"] for job in queued.values()) + 1
        browser_page.get_by_role("button", name="Promote", exact=True).click()
        wait_until(lambda: operator_api.get_job(second)["priority"] == promoted, 15, "the promote")
        # ...so it is first in the queue, and the panel shows its new priority and place
        order = [job["job_id"] for job in operator_api.queue()["jobs"] if job["job_id"] in (first, second)]
        assert order == [second, first]
        position = next(
            job["queue_position"] for job in operator_api.queue()["jobs"] if job["job_id"] == second
        )
        wait_until(
            lambda: (_summary(browser_page)["Priority"], _summary(browser_page)["Queue position"])
            == (str(promoted), str(position)),
            15,
            "the panel's priority and place",
        )


@SECOND_GROUP
def test_delete_on_the_job_page_removes_the_ended_job_and_returns_to_the_list(operator_api, browser_page):
    project_id = _project(operator_api, [{"name": "build", "run": "echo built"}])
    job_id = _run(operator_api, project_id)
    assert _wait_job(operator_api, job_id, lambda job: job["status"] in ENDED)["status"] == "succeeded"
    with console_server(operator_api) as server:
        _open(browser_page, server, f"/jobs/{job_id}")
        with browser_page.expect_navigation(url=server.origin + "/"):
            browser_page.get_by_role("button", name="Delete", exact=True).click()
        # The API no longer has the job, and the list does not show it
        with pytest.raises(ApiError) as gone:
            operator_api.get_job(job_id)
        assert (gone.value.status, gone.value.code) == (404, "JOB_NOT_FOUND")
        assert job_id not in _rows(browser_page)


@SECOND_GROUP
def test_unfreeze_on_the_dlq_page_lifts_a_frozen_key(operator_api, browser_page, console_stack):
    # Given an idempotency key of the operator's project frozen by the dead-letter freeze
    project_id = _project(operator_api, [{"name": "build", "run": "echo built"}])
    key = f"{project_id}:ref:refs/heads/release-{secrets.token_hex(3)}:0123456789abcdef"
    entries = [
        {
            "job_id": f"job_{n:026d}",
            "failed_at": "2026-12-01T10:00:00+00:00",
            "error": "Relevo.Fatal.ExitCode",
        }
        for n in range(3)
    ]
    assert freezes.freeze(console_stack.table_name, key, project_id, entries, datetime.now(UTC), 0)
    with console_server(operator_api) as server:
        _open(browser_page, server, "/dlq")
        row = browser_page.locator("table.frozen tbody tr", has_text=key)
        assert row.locator("td").nth(3).inner_text() == ", ".join(entry["job_id"] for entry in entries)
        # When Unfreeze is pressed, the page reloads with the key no longer frozen
        with browser_page.expect_navigation():
            row.get_by_role("button", name="Unfreeze", exact=True).click()
        expect(browser_page.locator("table.frozen tbody tr", has_text=key)).to_have_count(0)
    # Then the API lifted it: automatic runs of the key go again, and the record says who lifted it
    assert key not in [k["idempotency_key"] for k in operator_api.dead_letters().get("frozen_keys") or []]
    record = freezes.get_freeze(console_stack.table_name, key)
    assert (
        "frozen_at" not in record
        and record["unfrozen_by"] == operator_api.session.client("sts").get_caller_identity()["Arn"]
    )


HUMAN_TIME = re.compile(r"just now|\d+ s ago|\d+ min ago")


@SECOND_GROUP
def test_the_job_list_is_a_line_per_job_with_agent_progress_duration_and_human_times(
    operator_api, browser_page, screenshots
):
    # Given a group's jobs in different states: one that succeeded with a warning, one that failed
    # at its second stage, one still running
    group = f"team-{secrets.token_hex(3)}"
    lint = {"name": "lint", "run": 'echo "2 style issues"; exit 3', "warning_exit_codes": [3]}
    ok = _project(operator_api, [{"name": "build", "run": "echo built"}, lint], group=group)
    failing = _project(
        operator_api, [{"name": "build", "run": "echo built"}, {"name": "sign", "run": "exit 1"}], group=group
    )
    slow = _project(
        operator_api,
        [{"name": "build", "run": "sleep 60", "kill_grace_sec": 1}, {"name": "deploy", "run": "true"}],
        group=group,
    )
    warned, failed = _run(operator_api, ok), _run(operator_api, failing)
    for job_id in (warned, failed):
        _wait_job(operator_api, job_id, lambda job: job["status"] in ENDED)
    running = _run(operator_api, slow)
    _wait_job(operator_api, running, lambda job: job["stages"][0]["status"] == "running")
    try:
        with console_server(operator_api) as server:
            _open(browser_page, server, f"/?group={group}")
            assert sorted(_rows(browser_page)) == sorted([warned, failed, running])
            listed = {job["job_id"]: job for job in operator_api.list_jobs(group=group)["jobs"]}

            def cells(job_id: str) -> dict[str, str]:
                row = browser_page.locator(f"tr[data-job-id='{job_id}']")
                names = browser_page.locator("table.jobs thead th").all_inner_texts()
                return dict(zip(names, row.locator("td").all_inner_texts(), strict=True))

            # Then each row says who ran it, how far it got and for how long, in one line
            done = cells(warned)
            assert done["Status"].split() == ["succeeded", "warnings"] and done["Agent"] == "console-mac"
            assert done["Progress"].strip() == "2/2" and re.fullmatch(r"\d+s", done["Duration"]), done
            assert cells(failed)["Progress"].strip() == "1/2" and cells(failed)["Status"] == "failed"
            busy = cells(running)
            assert busy["Progress"].strip() == "0/2 · build" and busy["Duration"].endswith("(running)"), busy
            # with times relative to now, the exact time on hover, and no microseconds anywhere
            created = browser_page.locator(f"tr[data-job-id='{warned}'] td.created time")
            assert HUMAN_TIME.fullmatch(created.inner_text()), created.inner_text()
            assert created.get_attribute("title") == exact_time(listed[warned]["created_at"])
            assert not re.search(
                r"\d\d:\d\d:\d\d\.\d{6}|\+00:00", browser_page.locator("table.jobs tbody").inner_text()
            )
            _screenshot(browser_page, screenshots, "jobs")
            # and each row is one line: the actions wait in a menu
            heights = [
                box["height"]
                for box in browser_page.locator("table.jobs tbody tr").evaluate_all(
                    "rows => rows.map(r => r.getBoundingClientRect().toJSON())"
                )
            ]
            assert max(heights) < 40, heights
            assert browser_page.locator(f"tr[data-job-id='{warned}'] button.action").first.is_hidden()
    finally:
        operator_api.cancel_job(running)


@SECOND_GROUP
def test_the_job_page_shows_each_stages_mac_the_error_as_a_sentence_and_the_log_above_the_fold(
    operator_api, browser_page, screenshots
):
    # Given a job whose build succeeded and whose sign exited 1 (not retryable)
    project_id = _project(
        operator_api,
        [
            {"name": "build", "run": "echo compiled"},
            {"name": "sign", "run": 'echo "signing App.ipa"; echo "no identity found" >&2; exit 1'},
        ],
    )
    job_id = _run(operator_api, project_id)
    assert _wait_job(operator_api, job_id, lambda job: job["status"] in ENDED)["status"] == "failed"
    with console_server(operator_api) as server:
        _open(browser_page, server, f"/jobs/{job_id}")
        browser_page.locator("#log-lines .line", has_text="no identity found").wait_for(timeout=30_000)
        # Then each stage says the Mac it ran on, and the failure is a sentence, not JSON
        chips = [chip.split() for chip in browser_page.locator("ol.pipeline li").all_inner_texts()]
        assert [chip[:4] for chip in chips] == [
            ["build", "succeeded", "on", "console-mac"],
            ["sign", "failed", "on", "console-mac"],
        ], chips
        assert _summary(browser_page)["Macs"] == "console-mac (build, sign)"
        error = browser_page.locator("#job-error").inner_text()
        assert (
            error == "sign failed on console-mac: its command exited 1 (Relevo.Fatal.ExitCode, 1 attempt)."
        ), error
        assert "{" not in browser_page.locator(".summary").inner_text()
        # And the log is above the fold, each stage's output under its label
        box = browser_page.locator("#log-lines").bounding_box()
        assert box["y"] + 100 < browser_page.viewport_size["height"], box
        starts = browser_page.locator("#log-lines .line.stage-start").evaluate_all(
            "lines => lines.map(l => l.dataset.where)"
        )
        assert starts == ["build · on console-mac", "sign · on console-mac"], starts
        assert _lines(browser_page) == ["compiled", "signing App.ipa", "no identity found"]
        _screenshot(browser_page, screenshots, "job-failed")


@SECOND_GROUP
def test_the_fleet_page_pauses_drains_and_resumes_agents_and_a_regions_dispatch(
    operator_api, browser_page, console_stack, screenshots
):
    # Given two agents of the masking region reporting (presence records: a drain of a real agent
    # would stop its process), and an operator who is one of the stack's admins
    from datetime import timedelta

    from relevo_core.store import agents as agent_store

    suffix = secrets.token_hex(3)
    macs = [f"fleet-mac-{suffix}-{n}" for n in (1, 2)]
    now = datetime.now(UTC)
    for mac in macs:
        agent_store.put_presence(
            console_stack.table_name,
            agent_store.AgentPresence(
                agent_id=mac,
                region=MASKING_REGION,
                capacity=1,
                running=0,
                version="test",
                last_seen=now,
                interval_sec=300,
            ),
        )

    def fleet() -> dict[str, dict]:
        return {a["agent_id"]: a for a in operator_api.queue()["agents"] if a["agent_id"] in macs}

    try:
        with console_server(operator_api) as server:
            _open(browser_page, server, "/fleet")
            browser_page.get_by_label("Note").fill("Xcode 16.2 update")
            browser_page.get_by_label("For").select_option(label="2 hours")
            # When the first is paused and the second drained from their rows
            with browser_page.expect_navigation():
                browser_page.locator(f"tr[data-agent='{macs[0]}']").get_by_role(
                    "button", name="Pause", exact=True
                ).click()
            browser_page.get_by_label("Note").fill("OS update")
            with browser_page.expect_navigation():
                browser_page.locator(f"tr[data-agent='{macs[1]}']").get_by_role(
                    "button", name="Drain", exact=True
                ).click()
            # Then the API says so, with the note and about two hours
            paused, drained = (fleet()[mac]["paused"] for mac in macs)
            assert (paused["drain"], paused["note"], paused["timeout_sec"]) == (
                False,
                "Xcode 16.2 update",
                7200,
            ), paused
            assert (drained["drain"], drained["note"]) == (True, "OS update"), drained
            row = browser_page.locator(f"tr[data-agent='{macs[0]}']")
            assert row.locator("td.state").inner_text().startswith("paused until ")
            assert (
                row.get_by_role("button", name="Pause", exact=True).get_attribute("title")
                == "it is paused already"
            )
            # And a region's dispatch is paused and resumed the same way
            region = browser_page.locator(f"section[data-region='{MASKING_REGION}']")
            with browser_page.expect_navigation():
                region.get_by_role("button", name="Pause dispatch").click()
            assert [p["region"] for p in operator_api.queue()["paused_regions"]] == [MASKING_REGION]
            assert (
                browser_page.locator(f"p.dispatch-paused[data-region='{MASKING_REGION}']")
                .inner_text()
                .startswith("Dispatch paused until ")
            )
            _screenshot(browser_page, screenshots, "fleet")
            with browser_page.expect_navigation():
                browser_page.locator(f"section[data-region='{MASKING_REGION}']").get_by_role(
                    "button", name="Resume dispatch"
                ).click()
            assert operator_api.queue()["paused_regions"] == []
            # And Resume ends each agent's pause, as the API then says
            for mac in macs:
                with browser_page.expect_navigation():
                    browser_page.locator(f"tr[data-agent='{mac}']").get_by_role(
                        "button", name="Resume", exact=True
                    ).click()
            assert [fleet()[mac]["paused"] for mac in macs] == [None, None]
        # A user who is no admin of the stack sees the buttons disabled, saying why
        viewer = iam_user(console_stack, f"fleet-viewer-{suffix}")
        with console_server(viewer.api) as server:
            _open(browser_page, server, "/fleet")
            pause = browser_page.locator(f"tr[data-agent='{macs[0]}']").get_by_role(
                "button", name="Pause", exact=True
            )
            assert pause.is_disabled()
            assert pause.get_attribute("title").startswith(
                f"{viewer.arn} is not one of the stack's AdminPrincipals"
            )
    finally:
        for mac in macs:
            try:
                operator_api.resume_agent(mac, MASKING_REGION)
            except ApiError:
                pass
        operator_api.resume_region(MASKING_REGION)
        for mac in macs:
            agent_store.put_presence(
                console_stack.table_name,
                agent_store.AgentPresence(
                    agent_id=mac,
                    region=MASKING_REGION,
                    capacity=1,
                    running=0,
                    version="test",
                    last_seen=datetime.now(UTC) - timedelta(days=1),
                    interval_sec=300,
                ),
            )


@SECOND_GROUP
def test_the_run_page_says_in_one_line_when_the_repository_cannot_be_reached_and_runs_a_typed_ref(
    operator_api, browser_page, screenshots
):
    # Given a project whose repository's host does not resolve (an offline laptop, a typo): .invalid never
    # does
    project_id = _project(operator_api, [{"name": "build", "run": "echo build"}])
    with console_server(operator_api, git_base_url="https://git.invalid") as server:
        _open(browser_page, server, f"/run?project={project_id}")
        # Then the page says why in one line, no git "fatal:", and still takes a ref typed in
        state = browser_page.locator("#run-refs-state")
        expect(state).to_have_text(
            re.compile(
                r"^Could not list the branches: type a branch or tag \(git\.invalid could not be "
                r"(resolved|reached)"
            ),
            timeout=30_000,
        )
        assert "fatal" not in state.inner_text() and "\n" not in state.inner_text()
        browser_page.get_by_label("Branch or tag").fill("release/5.0")
        _screenshot(browser_page, screenshots, "run-page-unreachable")
        browser_page.get_by_role("button", name="Run", exact=True).click()
        link = browser_page.locator("#run-job")
        link.wait_for(timeout=30_000)
        job_id = link.inner_text()
    job = operator_api.get_job(job_id)
    assert (job["ref"], job["trigger"]["type"]) == ("release/5.0", "manual")
    _wait_job(operator_api, job_id, lambda job: job["status"] in ENDED)


@SECOND_GROUP
def test_the_job_page_shows_a_row_per_shard_under_its_stage_and_the_list_counts_shard_runs(
    operator_api, browser_page, screenshots
):
    # Given a job whose test stage runs as a matrix of two devices, on the console's Mac
    matrix = {"device": ["iPhone 16", "iPad Air"], "os": ["18.2"]}
    project_id = _project(
        operator_api,
        [
            {"name": "build", "run": "echo compiled"},
            {"name": "test", "run": 'echo "testing on $RELEVO_MATRIX_DEVICE"', "matrix": matrix},
        ],
    )
    job_id = _run(operator_api, project_id)
    assert _wait_job(operator_api, job_id, lambda job: job["status"] in ENDED)["status"] == "succeeded"
    labels = ["device=iPhone 16, os=18.2", "device=iPad Air, os=18.2"]
    with console_server(operator_api) as server:
        _open(browser_page, server, f"/jobs/{job_id}")
        browser_page.locator("#log-lines .line", has_text="testing on iPad Air").wait_for(timeout=30_000)
        # Then each shard is a row under its stage: its label, status, attempt, Mac and duration
        order = browser_page.locator("table.steps tbody tr").evaluate_all(
            "rows => rows.map(r => r.dataset.stage || (r.dataset.shardOf + '/' + r.dataset.shard))"
        )
        assert order == ["build", "test", "test/0", "test/1"], order
        rows = [
            row.locator("td").all_inner_texts()
            for row in browser_page.locator("table.steps tr.shard[data-shard-of=test]").all()
        ]
        assert [row[1:5] for row in rows] == [[label, "succeeded", "1", "console-mac"] for label in labels], (
            rows
        )
        assert all(re.fullmatch(r"\d+s", row[7]) for row in rows), rows
        # the stage's chip counts its shards, and the Macs name the shards they ran
        assert browser_page.locator("li.stage-chip[data-stage=test] .shards").inner_text() == "2/2 shards"
        summary = _summary(browser_page)
        assert summary["Macs"] == f"console-mac (build, test[{labels[0]}], test[{labels[1]}])"
        assert summary["Progress"] == "2 of 2 stages (3 of 3 runs, a shard each)"
        # and the log names the shard each run of lines comes from
        ipad = browser_page.locator("#log-lines .line", has_text="testing on iPad Air")
        assert (ipad.get_attribute("data-shard"), ipad.get_attribute("data-where")) == (
            "1",
            f"test[{labels[1]}] · on console-mac",
        )
        _screenshot(browser_page, screenshots, "job-shards")
        # The job list's progress counts runs: build, and one per shard
        _open(browser_page, server, f"/?project={project_id}")
        progress = browser_page.locator(f"tr[data-job-id='{job_id}'] td.progress")
        assert progress.inner_text().strip() == "3/3"
        assert progress.locator("progress").get_attribute("max") == "3"
