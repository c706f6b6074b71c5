"""The console's deliveries page renders what GET /deliveries answers, with its filters."""

from __future__ import annotations

import boto3
from starlette.testclient import TestClient

from relevo_cli.api import RelevoApi
from relevo_cli.console.app import create_app
from relevo_cli.console.security import ConsoleSecrets
from relevo_cli.console.state import Console

PORT = 8765
ORIGIN = f"http://127.0.0.1:{PORT}"
RECORDS = [
    {
        "direction": "incoming",
        "project": "ios-app",
        "target": "webhook:github",
        "event": "push",
        "outcome": "refused",
        "at": "2026-12-01T10:00:02.000+00:00",
        "http_status": 401,
        "attempt": 1,
        "reason": "SIGNATURE_INVALID",
    },
    {
        "direction": "outgoing",
        "project": "ios-app",
        "target": "github_status",
        "event": "queued",
        "outcome": "delivered",
        "at": "2026-12-01T10:00:01.000+00:00",
        "http_status": 201,
        "attempt": 2,
        "latency_ms": 38,
        "job_id": "job_0000000000000000000000a",
    },
]


class RecordedApi(RelevoApi):
    asked: list = []

    def deliveries(self, project=None, failed=False):
        self.asked.append((project, failed))
        return {"deliveries": RECORDS, "count": len(RECORDS)}


def test_the_page_lists_incoming_and_outgoing_deliveries_and_passes_its_filters():
    secrets_ = ConsoleSecrets()
    api = RecordedApi("http://127.0.0.1:9/v1", "us-east-1", boto3.session.Session(region_name="us-east-1"))
    client = TestClient(
        create_app(Console(api, caller=lambda: "arn:aws:iam::123456789012:user/ops"), secrets_, PORT),
        base_url=ORIGIN,
        follow_redirects=False,
    )
    assert client.get(f"/?token={secrets_.token}").status_code == 303
    page = client.get("/deliveries?project=ios-app&failed=1")
    assert page.status_code == 200
    assert api.asked[-1] == ("ios-app", True)
    html = page.text
    for shown in (
        "SIGNATURE_INVALID",
        "webhook:github",
        "github_status",
        '<a href="/jobs/job_0000000000000000000000a">',
        "401",
        "38",
    ):
        assert shown in html
    assert 'name="failed" value="1" checked' in html
