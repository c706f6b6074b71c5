"""The local Apple service as the demo and the drills start it (relevo_local.apple.provision): on
the real clock, with a key and an app of its own, the key stored in Secrets Manager as a project
stores it, and an agent config that sends the release effects there."""

from __future__ import annotations

import json
import tomllib
from datetime import UTC, datetime

import httpx
import pytest

from relevo_agent.config import ReleaseEndpoints
from relevo_agent.effects.apple_token import bearer_token
from relevo_core.aws import client
from relevo_local.apple.provision import start_local_apple


@pytest.fixture
def apple():
    started = start_local_apple()
    yield started
    assert started.service.take_mismatches() == []
    started.stop()


def test_the_stored_key_signs_tokens_the_service_accepts_and_the_config_points_there(local_stack, apple):
    # Given the service's key stored where a project's release keys live
    name = f"relevo/{local_stack.stack_name}/_release/demo-app/asc-key"
    apple.store_key(client("secretsmanager"), name)
    apple.store_key(client("secretsmanager"), name)  # stored again: replaced, not refused

    # When a token is made from the stored secret and the app asked for
    stored = json.loads(client("secretsmanager").get_secret_value(SecretId=name)["SecretString"])
    token = bearer_token(stored, datetime.now(UTC).timestamp())
    answer = httpx.get(
        f"{apple.service.url}/v1/apps/{apple.app_id}", headers={"Authorization": f"Bearer {token}"}
    )

    # Then Apple's stand-in knows the key and the app, and the agent's config names the service
    assert answer.status_code == 200, answer.text
    assert answer.json()["data"]["id"] == apple.app_id
    endpoints = ReleaseEndpoints.model_validate(
        tomllib.loads(apple.agent_config(stapler=["/usr/bin/true"]))["release_endpoints"]
    )
    assert endpoints.app_store_connect == apple.service.url
    assert endpoints.notary == f"{apple.service.url}/notary/v2"
    assert endpoints.notary_upload == f"{apple.service.url}/s3"
    assert endpoints.stapler == ["/usr/bin/true"]


def test_a_token_of_another_key_is_refused(apple):
    # Given a key the service was never given
    other = start_local_apple()
    try:
        token = bearer_token(other.key_secret(), datetime.now(UTC).timestamp())
    finally:
        other.stop()

    # When it asks for the app, then it is refused as Apple refuses
    answer = httpx.get(
        f"{apple.service.url}/v1/apps/{apple.app_id}", headers={"Authorization": f"Bearer {token}"}
    )
    assert answer.status_code == 401
