"""The console's guard on a loopback server (issue 18, point 7): Host (DNS rebinding), Origin
(cross-site requests), the token-for-cookie exchange and the CSP. Requests are refused before any
route runs, so the API here is one nothing listens at (port 9): a request that got through to a
route would fail differently."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import boto3
import pytest
from starlette.testclient import TestClient

from relevo_cli.api import RelevoApi
from relevo_cli.console.app import create_app
from relevo_cli.console.render import HERE
from relevo_cli.console.security import COOKIE, ConsoleSecrets
from relevo_cli.console.server import ConsoleServer
from relevo_cli.console.state import Console
from tests.helpers.stack_files import UNREACHABLE, unreachable_stack_file

PORT = 8765
ORIGIN = f"http://127.0.0.1:{PORT}"


@pytest.fixture()
def secrets_() -> ConsoleSecrets:
    return ConsoleSecrets()


@pytest.fixture()
def client(secrets_: ConsoleSecrets) -> TestClient:
    api = RelevoApi(f"{UNREACHABLE}/v1", "us-east-1", boto3.session.Session(region_name="us-east-1"))
    app = create_app(Console(api, caller=lambda: "arn:aws:iam::123456789012:user/nobody"), secrets_, PORT)
    return TestClient(app, base_url=ORIGIN, follow_redirects=False)


def _signed_in(client: TestClient, secrets_: ConsoleSecrets) -> TestClient:
    response = client.get(f"/?token={secrets_.token}")
    assert response.status_code == 303, response.text
    return client


def test_the_token_is_exchanged_for_an_httponly_samesite_strict_cookie(client, secrets_):
    response = client.get(f"/run?project=app&token={secrets_.token}")
    assert response.status_code == 303
    assert response.headers["location"] == "/run?project=app"  # the token leaves the address bar
    cookie = response.headers["set-cookie"]
    assert cookie.startswith(f"{COOKIE}={secrets_.session};")
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie
    assert secrets_.token not in cookie
    assert client.get("/static/console.css").status_code == 200


def test_without_the_cookie_or_with_a_wrong_token_nothing_answers(client, secrets_):
    assert client.get("/static/console.css").status_code == 401
    assert client.get("/?token=guessed").status_code == 403
    client.cookies.set(COOKIE, "guessed")
    assert client.get("/static/console.css").status_code == 401


def _fresh_browser(client: TestClient) -> TestClient:
    """Another browser on this console: the same app, no cookie."""
    return TestClient(client.app, base_url=ORIGIN, follow_redirects=False)


def test_the_token_is_spent_by_its_exchange_and_another_browser_using_it_is_refused(client, secrets_):
    _signed_in(client, secrets_)
    other = _fresh_browser(client)
    response = other.get(f"/jobs/j-1?token={secrets_.token}")
    assert response.status_code == 410
    assert "set-cookie" not in response.headers
    assert "This console link was already used" in response.text
    assert other.get("/static/console.css").status_code == 401


def test_a_signed_in_browser_opening_the_spent_link_again_keeps_its_session(client, secrets_):
    first = _signed_in(client, secrets_).cookies.get(COOKIE)
    response = client.get(f"/run?project=app&token={secrets_.token}")
    assert response.status_code == 303 and response.headers["location"] == "/run?project=app"
    assert "set-cookie" not in response.headers  # the session it has is the one it keeps
    assert client.cookies.get(COOKIE) == first
    assert client.get("/static/console.css").status_code == 200


def test_a_spent_link_refused_announces_a_new_single_use_link_and_a_wrong_token_announces_nothing(secrets_):
    announced: list[str] = []
    api = RelevoApi(f"{UNREACHABLE}/v1", "us-east-1", boto3.session.Session(region_name="us-east-1"))
    app = create_app(
        Console(api, caller=lambda: "arn:aws:iam::123456789012:user/nobody"),
        secrets_,
        PORT,
        announce=announced.append,
    )
    laptop, other, third = (TestClient(app, base_url=ORIGIN, follow_redirects=False) for _ in range(3))
    assert laptop.get(f"/?token={secrets_.token}").status_code == 303
    assert other.get("/?token=guessed").status_code == 403 and announced == []
    refused = other.get(f"/?token={secrets_.token}")
    assert refused.status_code == 410 and "new link was just printed in the terminal" in refused.text
    [link] = announced
    assert link.startswith(f"{ORIGIN}/?token=") and secrets_.token not in link
    # The new link is the same until it is used (a second refusal hands it out again)...
    assert third.get(f"/?token={secrets_.token}").status_code == 410 and announced == [link, link]
    signed_in = other.get(link.removeprefix(ORIGIN))
    assert signed_in.status_code == 303 and signed_in.headers["set-cookie"].startswith(
        f"{COOKIE}={secrets_.session};"
    )
    assert other.get("/static/console.css").status_code == 200
    # ...and single-use too
    assert third.get(link.removeprefix(ORIGIN)).status_code == 410
    assert announced[-1] not in (link, f"{ORIGIN}/?token={secrets_.token}")


def test_a_rebound_host_name_is_refused(client, secrets_):
    _signed_in(client, secrets_)
    # DNS rebinding: attacker.example resolves to 127.0.0.1, and the browser sends its name.
    response = client.get("/static/console.css", headers={"Host": f"attacker.example:{PORT}"})
    assert response.status_code == 400
    assert client.get("/static/console.css", headers={"Host": f"localhost:{PORT}"}).status_code == 200


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "http://attacker.example"},
        # Another port of 127.0.0.1 is the same *site* (SameSite cookies go there), not the same origin.
        {"Origin": "http://127.0.0.1:9999"},
        {"Origin": "null"},
        {"Sec-Fetch-Site": "cross-site"},
        {"Referer": "http://attacker.example/page"},
        {},  # a change with neither Origin nor Referer
    ],
    ids=["other-site", "other-port", "opaque", "sec-fetch-cross-site", "referer-only", "no-origin"],
)
def test_a_cross_origin_post_is_refused_before_the_route_runs(client, secrets_, headers):
    _signed_in(client, secrets_)
    response = client.post(
        "/jobs/j-1/actions/approve", content=b"{}", headers={"Content-Type": "text/plain", **headers}
    )
    assert response.status_code == 403
    assert response.text.startswith("refused: ")


def test_a_cross_origin_read_is_refused_too(client, secrets_):
    _signed_in(client, secrets_)
    assert client.get("/static/console.css", headers={"Origin": "http://attacker.example"}).status_code == 403
    assert client.get("/static/console.css", headers={"Origin": ORIGIN}).status_code == 200


def test_every_response_carries_a_csp_with_no_inline_script_and_no_other_origin(client, secrets_):
    responses = [client.get("/static/job.js"), client.get("/?token=wrong")]
    _signed_in(client, secrets_)
    responses.append(client.get("/static/job.js"))
    for response in responses:
        policy = response.headers["content-security-policy"]
        directives = dict(part.strip().split(" ", 1) for part in policy.split(";"))
        assert directives["script-src"] == "'self'"
        assert directives["default-src"] == "'none'"
        assert "unsafe-inline" not in policy and "unsafe-eval" not in policy
        assert not re.search(r"https?:|\*", policy), policy
        assert response.headers["x-content-type-options"] == "nosniff"


def test_the_pages_have_no_inline_script_and_load_nothing_from_elsewhere():
    for template in (HERE / "templates").glob("*.html"):
        text = template.read_text()
        for tag in re.findall(r"<script\b[^>]*>", text):
            assert 'src="/static/' in tag or 'type="application/json"' in tag, (template.name, tag)
        assert not re.search(r"\son[a-z]+=", text), template.name  # no inline event handlers
        assert not re.search(r"(src|href)=\"(https?:)?//", text), template.name
    for static in (HERE / "static").iterdir():
        assert not re.search(r"https?://", static.read_text()), static.name


def test_the_server_binds_loopback_only():
    api = RelevoApi(f"{UNREACHABLE}/v1", "us-east-1", boto3.session.Session(region_name="us-east-1"))
    server = ConsoleServer(Console(api), port=0)
    try:
        assert server.socket.getsockname()[0] == "127.0.0.1"
        assert server.url.startswith(f"http://127.0.0.1:{server.port}/?token=")
    finally:
        server.socket.close()


def test_relevo_console_prints_its_url_with_the_token_first(tmp_path: Path):
    stack_file = unreachable_stack_file(tmp_path)
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "relevo_cli.main",
            "console",
            "--no-open",
            "--port",
            "0",
            "--stack-file",
            str(stack_file),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        first = process.stdout.readline().strip()
    finally:
        process.terminate()
        process.wait(timeout=10)
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/\?token=[A-Za-z0-9_-]{40,}", first), first
