"""Bad input to an app_store_upload, end to end (issue 44, point 8): a real job on the local stack,
its build stage handing on an .ipa and its upload stage declaring the built-in kind, run by the
real agent against the local Apple service (relevo_local.apple.provision). A missing key secret,
a malformed key, a key Apple refuses, an app Apple does not know, an .ipa whose build number cannot
be read, and a build number Apple already has for that version: each fails the stage for good
(Relevo.Fatal.EffectRefused, one attempt, never retried), the job says what is wrong, and Apple
holds nothing more than before. One Apple service and one agent serve every case."""

from __future__ import annotations

import io
import json
import plistlib
import time
import tomllib
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from relevo_agent.config import AgentConfig, ReleaseEndpoints
from relevo_agent.effects.apple_token import bearer_token
from relevo_agent.messages import Message
from relevo_agent.service import Agent
from relevo_cli.api import RelevoApi
from relevo_core.aws import client
from relevo_core.models.errors import ErrorClass
from relevo_local.apple.provision import LocalApple, start_local_apple
from tests.helpers.agents import handle_received
from tests.helpers.local_apple import Client, TeamKey, upload_build
from tests.helpers.stack import receive_stage, wait_for_execution

pytestmark = pytest.mark.timeout(240)

VERSION, BUILD = "1.4.0", "42"


def make_ipa(build: str = BUILD) -> bytes:
    info = {
        "CFBundleIdentifier": "com.example.bad",
        "CFBundleShortVersionString": VERSION,
        "CFBundleVersion": build,
    }
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        archive.writestr("Payload/App.app/Info.plist", plistlib.dumps(info))
        archive.writestr("Payload/App.app/App", b"\xcf\xfa\xed\xfe" + bytes(range(256)) * 8)
    return out.getvalue()


@pytest.fixture(scope="module")
def apple() -> Iterator[LocalApple]:
    started = start_local_apple()
    yield started
    assert started.service.take_mismatches() == [], "requests departed from Apple's description"
    started.stop()


@pytest.fixture(scope="module")
def mac(local_stack, apple, tmp_path_factory) -> Agent:
    """One real agent, its [release_endpoints] the local Apple service's."""
    root = tmp_path_factory.mktemp("bad-input")
    endpoints = ReleaseEndpoints.model_validate(tomllib.loads(apple.agent_config())["release_endpoints"])
    config = AgentConfig(
        agent_id="mac-bad",
        region="eu-west",
        capacity=1,
        workspace_root=root / "workspace",
        journal=root / "journal.sqlite3",
        max_clock_skew_sec=0.5,
        prefer_previous_sec=0,
        handoff_max_wait_sec=0,
        release_endpoints=endpoints,
    )
    return Agent(
        config, local_stack.table_name, local_stack.work_queues["eu-west"], api_url=local_stack.api_url
    )


@dataclass
class Case:
    """What a case puts in place (given the service, the project's app id and the key's name) and
    what the job must say."""

    prepare: Callable[[LocalApple, str, str], dict[str, Any]]
    says: str
    ipa: bytes = b""


def _stored(value: str) -> Callable[[LocalApple, str, str], dict[str, Any]]:
    def prepare(apple: LocalApple, app_id: str, key: str) -> dict[str, Any]:
        client("secretsmanager").create_secret(Name=key, SecretString=value)
        return {}

    return prepare


def _team_key(apple: LocalApple, app_id: str, key: str) -> dict[str, Any]:
    apple.store_key(client("secretsmanager"), key)
    return {}


def _unknown_app(apple: LocalApple, app_id: str, key: str) -> dict[str, Any]:
    apple.store_key(client("secretsmanager"), key)
    return {"app_id": "999999999"}


class _RealClockClient(Client):
    """The helper's client, its tokens signed with the provisioned key on the real clock (the
    service provision starts runs on it)."""

    def __init__(self, apple: LocalApple) -> None:
        super().__init__(apple.service, TeamKey(apple.issuer_id, apple.key_id, apple.private_key))
        self.secret = apple.key_secret()

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {bearer_token(self.secret, time.time())}"}


def _build_taken(apple: LocalApple, app_id: str, key: str) -> dict[str, Any]:
    """Another file already uploaded as this version and build number."""
    apple.store_key(client("secretsmanager"), key)
    connect = _RealClockClient(apple)
    try:
        upload_build(connect, app_id, make_ipa() + b"another file", VERSION, BUILD)
    finally:
        connect.http.close()
    return {}


def _other_team() -> str:
    """A well-formed key Apple has never been given: its tokens are refused (401)."""
    pem = (
        ec.generate_private_key(ec.SECP256R1())
        .private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        .decode()
    )
    return json.dumps(
        {"key_id": "ZZZZ999999", "issuer_id": "0b0b0b0b-0000-4000-8000-000000000000", "private_key": pem}
    )


CASES = {
    "missing key secret": Case(
        lambda apple, app_id, key: {}, "could not be read (ResourceNotFoundException)"
    ),
    "malformed key": Case(
        _stored(json.dumps({"key_id": "ABC123DEFG", "issuer_id": "i-1", "private_key": "not a PEM"})),
        "asc-key is malformed (issuer_id: String should match pattern",
    ),
    "key Apple refuses": Case(_stored(_other_team()), "App Store Connect refused the API key"),
    "app Apple does not know": Case(_unknown_app, "App Store Connect has no app 999999999"),
    "build number unreadable": Case(
        _team_key,
        "App.ipa's Info.plist CFBundleVersion is 'forty-two': App Store Connect takes 1 to 3 "
        "dot-separated integers",
        make_ipa("forty-two"),
    ),
    "build number already used": Case(
        _build_taken, f"build number {BUILD} is already used for version {VERSION}; the next free one is 43"
    ),
}


def _run_next(stack, agent: Agent, job_id: str) -> dict:
    task, receipt = receive_stage(stack, job_id, timeout=30)
    handle_received(
        agent,
        Message(agent.queue_url, {"Body": json.dumps(task), "ReceiptHandle": receipt, "MessageId": "m"}),
    )
    return task


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_fails_the_upload_for_good_saying_what_is_wrong_and_apple_gets_nothing(
    local_stack, apple, mac, project_id, tmp_path, name
):
    # Given an app of its own at Apple, what the case puts in place (a key, or none; an earlier
    # upload), and a project whose build hands on an .ipa its upload stage sends
    case = CASES[name]
    app_id = apple.service.connect.add_app(f"com.example.{project_id}", f"App {project_id}").id
    key = f"relevo/{local_stack.stack_name}/_release/{project_id}/asc-key"
    effect = {"kind": "app_store_upload", "file": "build/App.ipa", "app_id": app_id, "api_key": key}
    effect.update(case.prepare(apple, app_id, key))
    ipa = tmp_path / "App.ipa"
    ipa.write_bytes(case.ipa or make_ipa())
    api = RelevoApi.for_stack(local_stack)
    api.put_project(
        project_id,
        {
            "repo": f"acme/{project_id}",
            "region_affinity": "eu-west",
            "lease_ttl_sec": 10,
            "queue_timeout_sec": 60,
            "retry": {"backoff_base_sec": 0},
            "stages": [
                {
                    "name": "build",
                    "run": f"mkdir -p build && cp {ipa} build/App.ipa",
                    "handoff": ["build/App.ipa"],
                },
                {"name": "upload", "effect": effect, "exec_timeout_sec": 60},
            ],
        },
    )
    uploads_before = len(apple.service.connect.uploads_of(app_id))
    submissions_before = len(apple.service.notary.submissions)

    # When the real agent runs the job's stages
    job_id = api.run_project(project_id, {"ref": "main"})["job_id"]
    assert _run_next(local_stack, mac, job_id)["stage"] == "build"
    assert _run_next(local_stack, mac, job_id)["stage"] == "upload"

    # Then the job failed at the upload, for good: one attempt, refused, never retried
    assert wait_for_execution(local_stack, job_id)["status"] == "FAILED"
    job = api.get_job(job_id)
    upload = next(s for s in job["stages"] if s["name"] == "upload")
    assert (job["status"], upload["status"], upload["attempt"], upload["retry_count"]) == (
        "failed",
        "failed",
        1,
        0,
    )
    assert job["error"] == ErrorClass.EFFECT_REFUSED.value
    # and the job says what is wrong: the failed attempt's cause, and the job's own
    [failed] = upload["attempts_log"]
    assert (failed["attempt"], failed["error"]) == (1, ErrorClass.EFFECT_REFUSED.value)
    why = json.loads(failed["cause"])
    assert (why["effect"], why["attempt"]) == ("app_store_upload", 1)
    assert case.says in why["why"], why["why"]
    assert why["why"] in json.loads(json.loads(job["error_cause"])["cause"])["why"]
    # and Apple holds no upload and no submission more than before
    assert len(apple.service.connect.uploads_of(app_id)) == uploads_before
    assert len(apple.service.notary.submissions) == submissions_before
