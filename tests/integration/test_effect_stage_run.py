"""A stage's built-in effect run by the real agent code on the local stack (issue 44, point 2): a
job whose later stage declares `effect: {kind: s3_object, …}` puts the file an earlier stage handed
on, once, its values recorded as a command's; an agent stopped after the put and before its
conclusion leaves the next attempt to probe it done, never to put it again; and the release key
the effect reads never reaches a log, a value, the journal, the workspace or a stage's process."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import threading
from collections.abc import Mapping
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from relevo_agent.effects import registry
from relevo_agent.effects.kind import EffectContext, ProbeAnswer
from relevo_agent.effects.s3_object import OPERATION_METADATA, S3ObjectEffect
from relevo_agent.messages import Message
from relevo_agent.service import Agent
from relevo_cli.api import RelevoApi
from relevo_core.aws import client
from relevo_core.store.codec import from_attributes
from tests.helpers.agents import agent_at, handle_received
from tests.helpers.stack import job_items, receive_stage, wait_for_execution, wait_until

pytestmark = pytest.mark.timeout(240)

BUILD = "mkdir -p build && printf 'the app %s\\n' \"$RELEVO_JOB_ID\" > build/App.zip"


def _run_next(stack, agent: Agent, job_id: str) -> dict:
    task, receipt = receive_stage(stack, job_id, timeout=30)
    handle_received(
        agent,
        Message(agent.queue_url, {"Body": json.dumps(task), "ReceiptHandle": receipt, "MessageId": "m"}),
    )
    return task


def _stage(stack, job_id: str, name: str) -> dict:
    items = [from_attributes(i) for i in job_items(stack, job_id)]
    return next((item for item in items if item.get("stage_name") == name), {})


def _log(api: RelevoApi, job_id: str) -> str:
    return "".join(chunk["text"] for chunk in api.job_logs(job_id, limit=1000)["chunks"])


@pytest.fixture()
def release_profile(local_stack, tmp_path, monkeypatch) -> str:
    """An AWS profile of this machine's configuration holding the stack admin's credentials: what
    the publish stage's aws_profile names (a bucket outside the stack's own)."""
    credentials = tmp_path / "aws-credentials"
    lines = [
        "[release]",
        f"aws_access_key_id = {os.environ['AWS_ACCESS_KEY_ID']}",
        f"aws_secret_access_key = {os.environ['AWS_SECRET_ACCESS_KEY']}",
    ]
    if os.environ.get("AWS_SESSION_TOKEN"):
        lines.append(f"aws_session_token = {os.environ['AWS_SESSION_TOKEN']}")
    credentials.write_text("\n".join(lines) + "\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    return "release"


def _project(api: RelevoApi, project_id: str, bucket: str, after: str | None = None) -> None:
    stages: list[dict[str, Any]] = [
        {"name": "build", "run": BUILD, "handoff": ["build/App.zip"]},
        {
            "name": "publish",
            "effect": {"kind": "s3_object", "file": "build/App.zip", "bucket": bucket, "key": "app/App.zip"},
            "aws_profile": "release",
            "exec_timeout_sec": 60,
            "kill_grace_sec": 1,
        },
    ]
    if after is not None:
        stages.append({"name": "after", "run": after})
    api.put_project(
        project_id,
        {
            "repo": f"acme/{project_id}",
            "region_affinity": "eu-west",
            "lease_ttl_sec": 10,
            "queue_timeout_sec": 60,
            "retry": {"backoff_base_sec": 0},
            "stages": stages,
        },
    )


def _counted(puts: list[str]) -> Any:
    """The s3_object maker, its S3 client counting the puts it sends."""

    def make(spec: Any, plan: Any, endpoints: Any) -> S3ObjectEffect:
        import boto3

        def s3() -> Any:
            made = boto3.session.Session(profile_name=plan.aws_profile).client("s3")
            made.meta.events.register("before-call.s3.PutObject", lambda **kwargs: puts.append(spec.key))
            return made

        return S3ObjectEffect(spec, s3)

    return make


def test_a_later_stage_puts_the_handed_on_file_once_with_its_values(
    local_stack, project_id, tmp_path, release_profile, monkeypatch
):
    # Given a bucket, and a project whose build hands on App.zip and whose publish stage puts it
    # there (effect: s3_object, with the release profile's credentials)
    bucket = "dl-" + secrets.token_hex(4)
    client("s3").create_bucket(Bucket=bucket)
    api = RelevoApi.for_stack(local_stack)
    _project(api, project_id, bucket)
    puts: list[str] = []
    monkeypatch.setitem(registry.KINDS, "s3_object", _counted(puts))

    # When a real agent runs the job's two stages
    job_id = api.run_project(project_id, {"ref": "main"})["job_id"]
    mac = agent_at(tmp_path, local_stack, "mac-a")
    assert _run_next(local_stack, mac, job_id)["stage"] == "build"
    assert _run_next(local_stack, mac, job_id)["stage"] == "publish"

    # Then the job succeeded; the object is the handed-on file, put once, naming the operation
    assert wait_for_execution(local_stack, job_id)["status"] == "SUCCEEDED"
    body = f"the app {job_id}\n".encode()
    sha256 = hashlib.sha256(body).hexdigest()
    assert client("s3").get_object(Bucket=bucket, Key="app/App.zip")["Body"].read() == body
    head = client("s3").head_object(Bucket=bucket, Key="app/App.zip")
    assert head["Metadata"] == {OPERATION_METADATA: f"{job_id}:publish"}
    assert puts == ["app/App.zip"]
    # and the stage's values are the effect's, on its record and in its log as a command's are
    stage = _stage(local_stack, job_id, "publish")
    assert stage["status"] == "succeeded"
    outputs = stage["receipt"]["outputs"]
    assert (outputs["s3_uri"], outputs["sha256"]) == (f"s3://{bucket}/app/App.zip", sha256)
    assert outputs["etag"] and stage["outputs"] == outputs
    log = _log(api, job_id)
    assert f"[relevo] output sha256={sha256}" in log and "[relevo] output etag=" in log


class _StoppedAfterThePut:
    """The s3_object kind whose first perform, once its put went through and its values are
    recorded, waits for its agent to stop (the Mac dies before the attempt concludes)."""

    def __init__(self, inner: S3ObjectEffect, performed: threading.Event, performs: list[int]) -> None:
        self.inner, self.performed, self.performs = inner, performed, performs

    def perform(self, context: EffectContext) -> dict[str, str]:
        values = self.inner.perform(context)
        self.performs.append(1)
        context.record(values)
        self.performed.set()
        context.wait(60)  # returns at once when the agent is stopped
        return values

    def probe(self, context: EffectContext, recorded: Mapping[str, str]) -> ProbeAnswer:
        return self.inner.probe(context, recorded)

    def resume(self, context: EffectContext, recorded: Mapping[str, str]) -> dict[str, str]:
        return self.inner.resume(context, recorded)


def test_an_agent_stopped_after_the_put_leaves_the_next_attempt_to_find_it_done_never_to_put_again(
    local_stack, project_id, tmp_path, release_profile, monkeypatch
):
    # Given the publish stage's first attempt, whose put went through and whose values are recorded
    bucket = "dl-" + secrets.token_hex(4)
    client("s3").create_bucket(Bucket=bucket)
    api = RelevoApi.for_stack(local_stack)
    _project(api, project_id, bucket)
    puts: list[str] = []
    performed, performs = threading.Event(), []
    counted = _counted(puts)
    monkeypatch.setitem(
        registry.KINDS,
        "s3_object",
        lambda spec, plan, endpoints: _StoppedAfterThePut(
            counted(spec, plan, endpoints), performed, performs
        ),
    )
    job_id = api.run_project(project_id, {"ref": "main"})["job_id"]
    mac_a = agent_at(tmp_path, local_stack, "mac-a")
    assert _run_next(local_stack, mac_a, job_id)["stage"] == "build"
    runner = threading.Thread(target=_run_next, args=(local_stack, mac_a, job_id), daemon=True)
    runner.start()
    assert performed.wait(60), "the put never went through"
    wait_until(
        lambda: _stage(local_stack, job_id, "publish").get("outputs", {}).get("etag"),
        30,
        "the values on record",
    )

    # When its Mac's agent stops before the attempt concludes, and another Mac takes attempt 2
    mac_a.stages.stop_all("shutdown")
    runner.join(timeout=30)
    task = _run_next(local_stack, agent_at(tmp_path, local_stack, "mac-b"), job_id)

    # Then attempt 2 probed the object, found it this operation's, and succeeded without a second put
    assert task["attempt"] == 2
    assert wait_for_execution(local_stack, job_id)["status"] == "SUCCEEDED"
    assert puts == ["app/App.zip"] and performs == [1]
    stage = _stage(local_stack, job_id, "publish")
    assert (stage["status"], stage["attempt"]) == ("succeeded", 2)
    assert stage["reconciled"]["decision"] == "succeeded", stage["reconciled"]
    assert stage["reconciled"]["evidence"]["probe_exit"] == 0
    assert f"s3://{bucket}/app/App.zip" in stage["reconciled"]["evidence"]["probe_output"]
    sha256 = hashlib.sha256(f"the app {job_id}\n".encode()).hexdigest()
    assert stage["receipt"]["outputs"]["sha256"] == sha256 and stage["receipt"]["outputs"]["etag"]


def _pem_key() -> str:
    private = ec.generate_private_key(ec.SECP256R1())
    return private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()


class _ReadsTheKey:
    """The s3_object kind that first reads the project's release key, as an Apple kind reads its
    team key, and tries every way out with it: a log line, a recorded value, a returned value."""

    def __init__(self, inner: S3ObjectEffect, name: str) -> None:
        self.inner, self.name = inner, name

    def perform(self, context: EffectContext) -> dict[str, str]:
        key = context.secret(self.name)
        context.line(f"signing with key {key['key_id']}: {key['private_key']}")
        context.record({"key_id": key["key_id"], "attempted": key["private_key"]})
        values = self.inner.perform(context)
        return {**values, "returned": key["private_key"].splitlines()[1]}

    def probe(self, context: EffectContext, recorded: Mapping[str, str]) -> ProbeAnswer:
        return self.inner.probe(context, recorded)

    def resume(self, context: EffectContext, recorded: Mapping[str, str]) -> dict[str, str]:
        return self.inner.resume(context, recorded)


def test_the_release_key_an_effect_reads_never_leaves_the_agents_memory(
    local_stack, project_id, tmp_path, release_profile, monkeypatch
):
    # Given the project's release key in Secrets Manager, an effect that reads it (with the job's
    # session) and tries to log and record it, and a later stage that writes its environment down
    private_key = _pem_key()
    name = f"relevo/{local_stack.stack_name}/_release/{project_id}/asc.json"
    client("secretsmanager").create_secret(
        Name=name,
        SecretString=json.dumps({"key_id": "ABC123DEFG", "issuer_id": "i-1", "private_key": private_key}),
    )
    bucket = "dl-" + secrets.token_hex(4)
    client("s3").create_bucket(Bucket=bucket)
    api = RelevoApi.for_stack(local_stack)
    after_env = tmp_path / "after-env.txt"
    _project(api, project_id, bucket, after=f"env > {after_env}")
    counted = _counted([])
    monkeypatch.setitem(
        registry.KINDS,
        "s3_object",
        lambda spec, plan, endpoints: _ReadsTheKey(counted(spec, plan, endpoints), name),
    )

    # When a real agent runs the job
    job_id = api.run_project(project_id, {"ref": "main"})["job_id"]
    mac = agent_at(tmp_path, local_stack, "mac-a")
    for stage in ("build", "publish", "after"):
        assert _run_next(local_stack, mac, job_id)["stage"] == stage
    assert wait_for_execution(local_stack, job_id)["status"] == "SUCCEEDED"

    # Then the key was read (its id is on record), and none of its text is anywhere it could leak:
    # not the stage's log, its values, the journal, the workspace, the later stage's environment
    publish = _stage(local_stack, job_id, "publish")
    assert publish["outputs"]["key_id"] == "ABC123DEFG"
    pieces = [line for line in private_key.splitlines() if len(line) >= 16 and "-----" not in line]
    assert pieces
    log = _log(api, job_id)
    assert "signing with key ABC123DEFG: ******" in log
    records = json.dumps([from_attributes(item) for item in job_items(local_stack, job_id)], default=str)
    assert after_env.read_text()
    for piece in pieces:
        assert piece not in log
        assert piece not in records
        assert piece not in after_env.read_text()
        assert piece not in os.environ.values()
        for path in tmp_path.rglob("*"):
            if path.is_file() and not path.is_symlink():
                assert piece.encode() not in path.read_bytes(), path
