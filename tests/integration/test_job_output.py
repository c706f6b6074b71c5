"""A job's output through the API on the local stack: GET /jobs/{id}/logs paged forward and back,
the tail of the log in GET /jobs/{id}, `relevo logs -f` following a running job through dropped
connections, and artifacts downloaded through presigned links and checked against their sha256.

One job runs for the whole module: the real agent code (relevo_agent's Agent) runs its two stages
in a background thread while the follower reads the log through a relay that drops connections."""

from __future__ import annotations

import hashlib
import http.client
import json
import re
import secrets
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import requests
from typer.testing import CliRunner

from relevo_cli.api import ApiError, RelevoApi
from relevo_cli.follow import LogFollower
from relevo_cli.main import app as cli
from relevo_core.aws import client
from relevo_core.models.requests import MAX_SEQ
from relevo_core.store import artifacts as artifact_store
from relevo_core.store.log_reads import read_chunks
from tests.helpers import TEST_ADMIN_ARN
from tests.helpers.iam import iam_user
from tests.helpers.payloads import push_body
from tests.helpers.stack import deliver, register_project, wait_for_execution
from tests.integration.test_agent_logs_and_artifacts import _agent, _run_next

BUILD_LINES, SIGN_LINES = 300, 40
BUILD = (
    f'for i in $(seq 1 {BUILD_LINES}); do echo "build line $i"; sleep 0.01; done; '
    'mkdir -p "$RELEVO_ARTIFACT_DIR/sub"; head -c 200000 /dev/urandom > "$RELEVO_ARTIFACT_DIR/app.ipa"; '
    'echo dsym > "$RELEVO_ARTIFACT_DIR/sub/app.dsym"; echo build > "$RELEVO_ARTIFACT_DIR/report.txt"'
)
SIGN = (
    f'for i in $(seq 1 {SIGN_LINES}); do echo "sign line $i"; sleep 0.01; done; echo sign > '
    '"$RELEVO_ARTIFACT_DIR/report.txt"'
)
runner = CliRunner()


class FlakyRelay:
    """An HTTP relay in front of the local API that drops connections on purpose.

    The first `lose_pages` distinct pages that carry log chunks (each once) are relayed to the
    API, answered, and then dropped: the connection closes without a response, so the API served
    the page and the client never saw it. Counting connections from the first of those (0), the
    ones in `refuse` are closed once the request is read, before the API sees it, and the ones in
    `bad_gateway` are answered 502. Everything else passes through."""

    def __init__(self, upstream: str, refuse: set[int], bad_gateway: set[int], lose_pages: int) -> None:
        parts = urlsplit(upstream)
        self.upstream_host, self.upstream_port, self.prefix = parts.hostname, parts.port, parts.path
        self.refuse, self.bad_gateway, self.lose_pages = refuse, bad_gateway, lose_pages
        self.connections = 0
        self.output_began: int | None = None  # the connection of the first page lost
        self.lost_pages: set[str] = set()
        self.dropped: list[tuple[str, str]] = []  # (what, request path)
        self._lock = threading.Lock()
        relay = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                return

            def do_GET(self) -> None:
                self.close_connection = True
                with relay._lock:
                    index = relay.connections
                    relay.connections += 1
                    since = None if relay.output_began is None else index - relay.output_began
                if since in relay.refuse:
                    relay.dropped.append(("refused", self.path))
                    return  # closed without an answer
                if since in relay.bad_gateway:
                    relay.dropped.append(("502", self.path))
                    self._answer(
                        502, b'{"message": "Internal server error"}', {"Content-Type": "application/json"}
                    )
                    return
                upstream = http.client.HTTPConnection(relay.upstream_host, relay.upstream_port, timeout=30)
                upstream.request("GET", self.path, headers=dict(self.headers.items()))
                response = upstream.getresponse()
                body = response.read()
                upstream.close()
                chunks = json.loads(body).get("chunks") if response.status == 200 else None
                if chunks and len(relay.lost_pages) < relay.lose_pages and self.path not in relay.lost_pages:
                    relay.lost_pages.add(self.path)
                    relay.output_began = index if relay.output_began is None else relay.output_began
                    relay.dropped.append(("lost", self.path))
                    return  # the API answered; the client never hears it
                self._answer(
                    response.status,
                    body,
                    {"Content-Type": response.getheader("Content-Type") or "application/json"},
                )

            def _answer(self, status: int, body: bytes, headers: dict[str, str]) -> None:
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}{self.prefix}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _all_chunks(stack, job_id: str) -> list:
    chunks, from_seq = [], 0
    while from_seq is not None:
        page = read_chunks(stack.table_name, job_id, from_seq=from_seq, limit=50)
        chunks.extend(page.chunks)
        from_seq = page.next_seq
    return chunks


def _stack_file(stack, directory: Path) -> Path:
    path = directory / "stack.json"
    path.write_text(json.dumps(stack.model_dump()))
    return path


# The tests that read the followed job run on one worker: the job (a module fixture) is run once.
FOLLOWED_ON_ONE_WORKER = pytest.mark.xdist_group("job-output-followed")


@pytest.fixture(scope="module")
def followed(local_stack, tmp_path_factory):
    """A two-stage job run by a real agent in a thread, followed from seq 0 while it runs through
    a relay that refuses connections, answers 502 and loses pages that carried chunks."""
    tmp_path = tmp_path_factory.mktemp("job-output")
    project_id = "out-" + secrets.token_hex(4)
    secret = register_project(
        local_stack, project_id, [{"name": "build", "run": BUILD}, {"name": "sign", "run": SIGN}]
    )
    job_id = deliver(
        local_stack, project_id, push_body(f"acme/{project_id}", secrets.token_hex(20)), secret
    ).json()["job_id"]

    agent, agent_failures = _agent(tmp_path, local_stack, "mac-out"), []

    def run_stages() -> None:
        try:
            for _ in ("build", "sign"):
                _run_next(local_stack, agent, job_id)
        except BaseException as exc:  # reported by the test, not lost in the thread
            agent_failures.append(exc)

    relay = FlakyRelay(local_stack.api_url, refuse={1, 2, 8}, bad_gateway={4}, lose_pages=3)
    api = RelevoApi(relay.url, local_stack.region, RelevoApi.for_stack(local_stack).session)
    reads: list[dict[str, Any]] = []

    def fetch(from_seq: int) -> dict[str, Any]:
        try:
            page = api.job_logs(job_id, from_seq=from_seq, limit=2)
        except (requests.ConnectionError, ApiError) as exc:
            reads.append({"from_seq": from_seq, "error": type(exc).__name__})
            raise
        reads.append(
            {"from_seq": from_seq, "status": page["status"], "seqs": [c["seq"] for c in page["chunks"]]}
        )
        return page

    printed: list[str] = []
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        # The job runs in real time in the agent thread: a poll waits a little for it; a backoff
        # is recorded at its full length but not waited out.
        sleeps.append(seconds)
        time.sleep(0.05)

    follower = LogFollower(fetch=fetch, write=printed.append, sleep=sleep, poll_sec=0.2)
    thread = threading.Thread(target=run_stages, daemon=True)
    thread.start()
    try:
        code = follower.run(follow=True)
    finally:
        thread.join(120)
        relay.close()
    assert not agent_failures, agent_failures
    assert wait_for_execution(local_stack, job_id)["status"] == "SUCCEEDED"
    return {
        "project": project_id,
        "job": job_id,
        "code": code,
        "printed": printed,
        "reads": reads,
        "dropped": relay.dropped,
        "sleeps": sleeps,
        "follower": follower,
        "workspace": tmp_path / "mac-out",
        "tmp": tmp_path,
    }


@pytest.mark.timeout(240)
@FOLLOWED_ON_ONE_WORKER
def test_following_a_running_job_through_dropped_connections_prints_every_line_once(local_stack, followed):
    job_id, reads = followed["job"], followed["reads"]
    stored = _all_chunks(local_stack, job_id)

    # The connection was refused (before and during the output), answered 502, and three pages
    # that carried chunks were served by the API and lost on the way back
    assert [what for what, _ in followed["dropped"]].count("lost") == 3
    assert {"refused", "502", "lost"} == {what for what, _ in followed["dropped"]}
    failed = [i for i, read in enumerate(reads) if "error" in read]
    assert len(failed) == 7
    # each while the job was still running, and each followed by a read of the very same seq
    first_terminal = next(i for i, read in enumerate(reads) if read.get("status") == "succeeded")
    assert all(i < first_terminal for i in failed)
    assert all(reads[i + 1]["from_seq"] == reads[i]["from_seq"] for i in failed)
    assert any(reads[i]["from_seq"] > 0 for i in failed), "a drop in the middle of the output"
    # with a growing backoff between consecutive failures (0.5 s, then 1 s)
    assert 0.5 in followed["sleeps"] and 1.0 in followed["sleeps"]

    # Then what was printed is the stored log exactly: no gap, no repeat, in order
    assert followed["printed"] == [chunk.data for chunk in stored]
    lines = "".join(followed["printed"]).splitlines()
    assert [line for line in lines if line.startswith("build line ")] == [
        f"build line {i}" for i in range(1, BUILD_LINES + 1)
    ]
    assert [line for line in lines if line.startswith("sign line ")] == [
        f"sign line {i}" for i in range(1, SIGN_LINES + 1)
    ]
    # and the follower ended with the job, exit code 0 for succeeded
    assert (followed["code"], followed["follower"].status) == (0, "succeeded")
    assert followed["follower"].next_seq == len(stored)


@FOLLOWED_ON_ONE_WORKER
def test_the_log_pages_forward_and_back_by_seq(local_stack, followed):
    api, job_id = RelevoApi.for_stack(local_stack), followed["job"]
    stored = [chunk.data for chunk in _all_chunks(local_stack, job_id)]
    assert len(stored) >= 8, "enough chunks to page through"

    # Forward from 0, three at a time: next_seq chains the pages; more says when to stop
    forward, from_seq, pages = [], 0, []
    while True:
        page = api.job_logs(job_id, from_seq=from_seq, limit=3)
        pages.append(page)
        assert [c["seq"] for c in page["chunks"]] == list(range(from_seq, from_seq + len(page["chunks"])))
        assert len(page["chunks"]) <= 3
        forward.extend(page["chunks"])
        from_seq = page["next_seq"]
        if not page["more"]:
            break
    assert [c["text"] for c in forward] == stored
    assert pages[0]["before_seq"] is None and pages[1]["before_seq"] == 3
    assert {(p["status"], p["terminal"]) for p in pages} == {("succeeded", True)}
    first = forward[0]
    assert (first["stage"], first["attempt"], first["agent_id"], first["stream"]) == (
        "build",
        1,
        "mac-out",
        "combined",
    )
    # past the end: nothing, and next_seq stays where a follower waits
    assert api.job_logs(job_id, from_seq=len(stored))["chunks"] == []
    assert api.job_logs(job_id, from_seq=len(stored))["next_seq"] == len(stored)

    # Back from the end (the job view's log_tail.next_seq), three at a time: before_seq chains
    # the pages until the start
    end = api.get_job(job_id)["log_tail"]["next_seq"]
    assert (
        api.job_logs(job_id, before_seq=MAX_SEQ, limit=3)["chunks"]
        == api.job_logs(job_id, before_seq=end, limit=3)["chunks"]
    )
    backward, before, first_page = [], end, True
    while True:
        page = api.job_logs(job_id, before_seq=before, limit=3)
        assert [c["seq"] for c in page["chunks"]] == sorted(c["seq"] for c in page["chunks"])
        if first_page:
            assert page["next_seq"] == len(stored) and page["more"] is False
            first_page = False
        else:
            assert page["next_seq"] == before and page["more"] is True
        backward[:0] = page["chunks"]
        before = page["before_seq"]
        if before is None:
            break
    assert [c["text"] for c in backward] == stored
    middle = api.job_logs(job_id, before_seq=5, limit=2)
    assert ([c["seq"] for c in middle["chunks"]], middle["before_seq"], middle["next_seq"]) == ([3, 4], 3, 5)


@FOLLOWED_ON_ONE_WORKER
def test_bad_log_queries_are_400_and_an_unknown_job_404(local_stack, followed):
    api, job_id = RelevoApi.for_stack(local_stack), followed["job"]
    for params in (
        {"from_seq": -1},
        {"from_seq": "x"},
        {"limit": 0},
        {"limit": 1001},
        {"from_seq": 1, "before_seq": 2},
        {"tail": 5},
    ):
        with pytest.raises(ApiError) as refused:
            api.request("GET", f"/jobs/{job_id}/logs", params=params)
        assert (refused.value.status, refused.value.code) == (400, "QUERY_INVALID"), params

    missing = "job_" + "0" * 26
    admin = iam_user(local_stack, TEST_ADMIN_ARN.rsplit("/", 1)[1]).api
    with pytest.raises(ApiError) as unknown:
        admin.job_logs(missing)
    assert (unknown.value.status, unknown.value.code) == (404, "JOB_NOT_FOUND")
    with pytest.raises(ApiError) as hidden:  # not the caller's to view: 403, as for any job route
        api.job_logs(missing)
    assert (hidden.value.status, hidden.value.code) == (403, "FORBIDDEN")


@FOLLOWED_ON_ONE_WORKER
def test_the_job_view_carries_the_last_200_lines_and_the_artifacts(local_stack, followed):
    job_id = followed["job"]
    job = RelevoApi.for_stack(local_stack).get_job(job_id)
    stored = _all_chunks(local_stack, job_id)
    lines = "".join(chunk.data for chunk in stored).splitlines()

    tail = job["log_tail"]
    assert [line["text"] for line in tail["lines"]] == lines[-200:]
    assert tail["truncated"] is True and tail["next_seq"] == len(stored)
    by_seq = {chunk.seq: chunk for chunk in stored}
    for line in tail["lines"]:
        chunk = by_seq[line["seq"]]
        assert (line["stage"], line["attempt"]) == (chunk.stage, chunk.attempt)
        assert line["text"] in chunk.data or chunk.data.endswith(line["text"][:10])
    assert tail["lines"][-1]["stage"] == "sign" and "build line 300" in [
        line["text"] for line in tail["lines"]
    ]

    assert sorted((a["stage"], a["name"]) for a in job["artifacts"]) == [
        ("build", "app.ipa"),
        ("build", "report.txt"),
        ("build", "sub/app.dsym"),
        ("sign", "report.txt"),
    ]

    # `relevo status` prints the last lines under the job's table
    result = runner.invoke(
        cli, ["status", job_id, "--stack-file", str(_stack_file(local_stack, followed["tmp"]))]
    )
    assert result.exit_code == 0, result.output
    assert (
        lines[-1] in result.output
        and f"relevo job logs {job_id} -f --from-seq {len(stored)}" in result.output
    )


@FOLLOWED_ON_ONE_WORKER
def test_relevo_logs_prints_the_stored_log_and_follows_a_finished_job_to_its_exit_code(local_stack, followed):
    job_id, stack_file = followed["job"], str(_stack_file(local_stack, followed["tmp"]))
    everything = "".join(chunk.data for chunk in _all_chunks(local_stack, job_id))

    printed = runner.invoke(cli, ["logs", job_id, "--stack-file", stack_file])
    from_three = runner.invoke(cli, ["logs", job_id, "-f", "--from-seq", "3", "--stack-file", stack_file])
    only_sign = runner.invoke(cli, ["job", "logs", job_id, "--stage", "sign", "--stack-file", stack_file])

    # Every line labelled with its stage and attempt, each stage between a line where it begins
    # and one that says how it ended; without those, the stored text.
    assert printed.exit_code == 0, printed.output
    assert _unlabelled(printed.stdout) == everything.splitlines()
    markers = [line for line in printed.stdout.splitlines() if line.startswith("── ")]
    assert [_without_duration(marker) for marker in markers] == [
        "── build on mac-out ──",
        "── build succeeded on mac-out ──",
        "── sign on mac-out ──",
        "── sign succeeded on mac-out ──",
    ], markers
    # An end line says how long the stage ran (its record's started_at to ended_at)
    assert re.fullmatch(r"── build succeeded on mac-out after \d+s ──", markers[1]), markers
    assert {line.split(" | ", 1)[0] for line in printed.stdout.splitlines() if " | " in line} == {
        "build#1",
        "sign#1",
    }
    skipped = "".join(chunk.data for chunk in _all_chunks(local_stack, job_id)[:3])
    assert (
        from_three.exit_code == 0
        and _unlabelled(from_three.stdout) == everything[len(skipped) :].splitlines()
    )
    assert only_sign.exit_code == 0 and {
        line.split(" | ", 1)[0] for line in only_sign.stdout.splitlines() if " | " in line
    } == {"sign#1"}
    assert only_sign.stdout.splitlines()[0] == "── sign on mac-out ──", only_sign.stdout[:300]


def _without_duration(line: str) -> str:
    """An end line without how long the stage ran (` after 3s`), which varies from run to run."""
    return re.sub(r" after (?:\d+h \d+m|\d+m \d+s|\d+s)", "", line)


def _unlabelled(printed: str) -> list[str]:
    """The log's lines as stored: no stage markers, no `stage#attempt | ` labels."""
    return [re.sub(r"^\S+#\d+ \| ", "", line) for line in printed.splitlines() if not line.startswith("── ")]


@pytest.mark.timeout(120)
def test_following_a_failed_job_exits_1(local_stack, project_id, tmp_path):
    secret = register_project(
        local_stack, project_id, [{"name": "build", "run": 'echo "about to fail"; exit 3'}]
    )
    job_id = deliver(
        local_stack, project_id, push_body(f"acme/{project_id}", secrets.token_hex(20)), secret
    ).json()["job_id"]
    _run_next(local_stack, _agent(tmp_path, local_stack, "mac-fail"), job_id)
    assert wait_for_execution(local_stack, job_id)["status"] == "FAILED"

    result = runner.invoke(
        cli, ["logs", job_id, "-f", "--stack-file", str(_stack_file(local_stack, tmp_path))]
    )

    assert result.exit_code == 1
    assert [_without_duration(line) for line in result.stdout.splitlines()] == [
        "── build on mac-fail ──",
        "build#1 | about to fail",
        "── build failed on mac-fail: exit 3, Relevo.Fatal.ExitCode ──",
    ]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@FOLLOWED_ON_ONE_WORKER
def test_an_artifact_is_downloaded_through_a_two_minute_link_and_verified(local_stack, followed, tmp_path):
    api, job_id = RelevoApi.for_stack(local_stack), followed["job"]
    stack_file = str(_stack_file(local_stack, tmp_path))
    record = next(
        r
        for r in artifact_store.list_artifacts(local_stack.table_name, job_id, "build")
        if r.path == "app.ipa"
    )
    built = followed["workspace"] / followed["project"] / ".relevo-artifacts" / job_id / "build" / "app.ipa"

    # The link: a presigned S3 GET valid for 120 s, with the recorded sha256 and size
    link = api.artifact_link(job_id, "app.ipa")
    query = parse_qs(urlsplit(link["url"]).query)
    assert query["X-Amz-Expires"] == ["120"] and link["expires_in"] == 120
    assert (link["sha256"], link["size"], link["stage"]) == (record.sha256, record.size, "build")
    assert requests.get(link["url"], timeout=30).content == built.read_bytes()

    # `relevo artifacts get` downloads it and checks the sha256
    out = tmp_path / "dl" / "app.ipa"
    result = runner.invoke(
        cli, ["artifacts", "get", job_id, "app.ipa", "-o", str(out), "--stack-file", stack_file]
    )
    assert result.exit_code == 0, result.output
    assert _sha256(out) == record.sha256 == _sha256(built)
    # a name under a subdirectory, into a directory
    result = runner.invoke(
        cli, ["artifacts", "get", job_id, "sub/app.dsym", "-o", str(tmp_path), "--stack-file", stack_file]
    )
    assert result.exit_code == 0, result.output
    assert (tmp_path / "app.dsym").read_text() == "dsym\n"

    # Two stages left report.txt: the stage is named; an unknown name is 404
    with pytest.raises(ApiError) as ambiguous:
        api.artifact_link(job_id, "report.txt")
    assert (ambiguous.value.status, ambiguous.value.code) == (409, "ARTIFACT_AMBIGUOUS")
    assert ambiguous.value.body["details"] == {"stages": ["build", "sign"]}
    assert (
        requests.get(api.artifact_link(job_id, "report.txt", stage="sign")["url"], timeout=30).text
        == "sign\n"
    )
    for name, stage in (("nothing.bin", None), ("app.ipa", "sign")):
        with pytest.raises(ApiError) as missing:
            api.artifact_link(job_id, name, stage)
        assert (missing.value.status, missing.value.code) == (404, "ARTIFACT_NOT_FOUND")

    # A file changed in the bucket after it was recorded is refused, and nothing is left behind
    dsym = next(
        r
        for r in artifact_store.list_artifacts(local_stack.table_name, job_id, "build")
        if r.path == "sub/app.dsym"
    )
    bucket, key = dsym.uri.removeprefix("s3://").split("/", 1)
    client("s3").put_object(Bucket=bucket, Key=key, Body=b"tampered\n")
    target = tmp_path / "tampered"
    target.mkdir()
    result = runner.invoke(
        cli, ["artifacts", "get", job_id, "sub/app.dsym", "-o", str(target), "--stack-file", stack_file]
    )
    assert result.exit_code == 1
    assert "sha256" in result.output and list(target.iterdir()) == []
