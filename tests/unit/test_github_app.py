"""GitHub App mode: the App's JWT, the installation token exchange and the check run calls, each
checked against GitHub's published REST description; a recorder stands in for GitHub."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from urllib.parse import urlsplit

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from relevo_core.models.project_settings import CommitStatusSettings
from relevo_core.notify.github_app import (
    InstallationTokens,
    app_jwt,
    check_run_output_request,
    check_run_request,
    stage_summary,
)
from relevo_core.notify.sending import Clock, SendPolicy, Urllib3Transport
from relevo_core.notify.transitions import job_transition
from relevo_local.github.openapi import check_call
from tests.helpers.recorder import Recorder

KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
PEM = KEY.private_bytes(
    serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
).decode()
COMMIT = "b" * 40


def _settings(base: str = "https://api.github.com") -> CommitStatusSettings:
    return CommitStatusSettings(
        provider="github",
        api_url=base,
        app={"app_id": 1234, "installation_id": 99, "private_key_ref": "relevo/s/_status/app-key"},
    )


def _job(status, **extra):
    return {
        "pk": "JOB#j",
        "sk": "JOB",
        "job_id": "job_0000000000000000000000a",
        "project": "ios-app",
        "status": status,
        "updated_at": "t",
        "envelope": {"ref": "main", "commit": COMMIT, "trigger": {"type": "webhook", "source": "github"}},
        **extra,
    }


def test_the_app_jwt_is_rs256_issued_by_the_app_and_lives_under_ten_minutes():
    now = time.time()
    token = app_jwt(_settings().app, PEM, now)
    claims = jwt.decode(
        token, KEY.public_key(), algorithms=["RS256"], options={"verify_exp": False, "verify_iat": False}
    )
    assert claims["iss"] == "1234" and claims["iat"] <= now - 59 and claims["exp"] - claims["iat"] <= 600
    assert jwt.get_unverified_header(token)["alg"] == "RS256"


def test_the_installation_token_is_fetched_once_and_reused():
    recorder = Recorder().start()
    try:
        recorder.answer(
            201, body=json.dumps({"token": "ghs_installation", "expires_at": "2999-01-01T00:00:00Z"}).encode()
        )
        tokens = InstallationTokens(Urllib3Transport(), Clock(), secret=lambda name: PEM)
        policy = SendPolicy(1, 1, 2, 5, 0)
        settings = _settings(recorder.url)
        assert tokens.token(settings, policy, time.time() + 10) == "ghs_installation"
        assert tokens.token(settings, policy, time.time() + 10) == "ghs_installation"
        [request] = recorder.received()
        assert check_call("POST", request.path, request.json()) == "apps/create-installation-access-token"
        bearer = request.headers["authorization"].removeprefix("Bearer ")
        assert jwt.decode(bearer, KEY.public_key(), algorithms=["RS256"])["iss"] == "1234"
    finally:
        recorder.stop()


@pytest.mark.parametrize(
    "old,new,extra,state",
    [
        (None, "queued", {}, {"status": "queued"}),
        ("queued", "running", {}, {"status": "in_progress"}),
        ("running", "waiting", {"waiting_stage": "deploy"}, {"status": "in_progress"}),
        ("running", "succeeded", {}, {"status": "completed", "conclusion": "success"}),
        (
            "waiting",
            "failed",
            {"error_name": "Relevo.Approval.Timeout"},
            {"status": "completed", "conclusion": "timed_out"},
        ),
        ("running", "canceled", {}, {"status": "completed", "conclusion": "cancelled"}),
    ],
)
def test_check_runs_are_created_then_updated_as_github_describes_them(old, new, extra, state):
    transition = job_transition(_job(old) if old else None, _job(new, **extra))
    stages = [
        {
            "sk": "STAGE#00",
            "stage_name": "build",
            "status": "succeeded",
            "attempt": 1,
            "started_at": "2026-12-01T10:00:00+00:00",
            "ended_at": "2026-12-01T10:01:05.5+00:00",
        },
        {
            "sk": "STAGE#01",
            "stage_name": "deploy",
            "status": "running",
            "attempt": 2,
            "error_class": "retryable",
            "started_at": "2026-12-01T10:02:00Z",
        },
    ]
    now = datetime(2026, 12, 1, 10, 2, 12, 300000, tzinfo=UTC).timestamp()
    summary = stage_summary("running", ["build", "deploy", "notify"], stages, now)
    assert (
        "| build | succeeded | 1m 05s | 1 |  |" in summary
        and "| deploy | running | 12.3 s so far | 2 | retryable |" in summary
    )
    assert "| notify | pending |  |  |  |" in summary  # not dispatched yet: every stage of the plan is shown
    output = check_run_output_request(transition, _settings(), "acme/ios-app", "ghs", 77, summary)
    assert check_call(output.method, urlsplit(output.url).path, output.body) == "checks/update"
    assert set(output.body) == {"output"}  # a stage's update never touches the run's status or conclusion
    created = check_run_request(
        transition, _settings(), "acme/ios-app", "ghs", "https://x/jobs/j", None, summary, time.time()
    )
    assert check_call(created.method, urlsplit(created.url).path, created.body) == "checks/create"
    assert {k: created.body[k] for k in state} == state and created.body["head_sha"] == COMMIT
    updated = check_run_request(
        transition, _settings(), "acme/ios-app", "ghs", "https://x/jobs/j", 77, summary, time.time()
    )
    assert check_call(updated.method, urlsplit(updated.url).path, updated.body) == "checks/update"
    assert updated.url.endswith("/repos/acme/ios-app/check-runs/77") and "head_sha" not in updated.body
