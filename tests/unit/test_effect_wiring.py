"""The agent's side of a stage's built-in effect (relevo_agent.execute, relevo_agent.settle,
relevo_agent.effects.agent_side): the kind's values on the same path as a command's, its ending
made as a command's, its file kept inside the workspace, its keys read for its own project only and
masked, and its probe's answers read as the reconcile table's."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from relevo_agent.attempt import StageRun
from relevo_agent.config import AgentConfig
from relevo_agent.effects import agent_side, registry
from relevo_agent.effects.agent_side import FileProblem, ReleaseKeys, effect_file, probe_result
from relevo_agent.effects.kind import Answer, EffectContext, EffectFailed, ProbeAnswer
from relevo_agent.execute import StageCommand
from relevo_agent.journal import Journal, Operation, operation_id
from relevo_agent.lease import Lease
from relevo_agent.logs import Masker
from relevo_agent.reconcile import ReconcileAction, decide
from relevo_core.fleet.lease_timeline import LeaseTimeline
from relevo_core.models.errors import ErrorClass
from relevo_core.store import stage_attempts
from relevo_core.store.stage_attempts import AttemptOutcome, StageRef
from tests.unit.test_envelope import minimal_envelope

OP = "job_1:publish"
PRE = "commit=abc;inputs=00"
LOST = {"attempt": 1, "agent_id": "mac-a", "precondition_version": PRE}
EFFECT = {"kind": "s3_object", "file": "build/App.zip", "bucket": "downloads", "key": "App.zip"}


class _Shipper:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.masker = Masker(())

    def line(self, text: str) -> None:
        self.lines.append(text)


class _Kind:
    """A kind that records an id, then returns its state, or raises what it is given."""

    def __init__(self, failure: EffectFailed | None = None) -> None:
        self.failure = failure
        self.performed = 0

    def perform(self, context: EffectContext) -> dict[str, str]:
        self.performed += 1
        context.record({"upload_id": "u-1"})
        if self.failure is not None:
            raise self.failure
        return {"apple_state": "VALID"}

    def probe(self, context: EffectContext, recorded: Any) -> ProbeAnswer:
        raise AssertionError("not probed here")

    def resume(self, context: EffectContext, recorded: Any) -> dict[str, str]:
        raise AssertionError("not resumed here")


@pytest.fixture()
def setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    from relevo_core.models.envelope import read_envelope

    recorded: list[dict[str, str]] = []
    monkeypatch.setattr(stage_attempts, "record_outputs", lambda ref, values: recorded.append(dict(values)))
    config = AgentConfig(
        agent_id="mac-a", region="eu-west", workspace_root=tmp_path / "ws", journal=tmp_path / "j"
    )
    journal = Journal(tmp_path / "j.sqlite3")
    op_id = operation_id("job_1", "publish")
    journal.begin(Operation(op_id, "job_1", "publish", 1, 1, str(tmp_path), ""))
    workspace = tmp_path / "ws" / "p"
    (workspace / "build").mkdir(parents=True)
    (workspace / "build" / "App.zip").write_bytes(b"app")
    envelope = read_envelope(
        minimal_envelope(
            schema_version=7,
            stages=[{"name": "build", "command": "make"}, {"name": "publish", "effect": EFFECT}],
        )
    )
    run = StageRun(
        StageRef("table", "job_1", 1, 1, "mac-a"), Lease(LeaseTimeline(60, 10, 5), time.monotonic())
    )
    return {
        "command": StageCommand(config, journal, keychains=None),  # type: ignore[arg-type]  # no keychains: these stages do not sign
        "journal": journal,
        "recorded": recorded,
        "workspace": workspace,
        "envelope": envelope,
        "plan": envelope.stage("publish"),
        "run": run,
        "op_id": op_id,
        "shipper": _Shipper(),
    }


def _effect(setting: dict[str, Any]) -> Any:
    return setting["command"].effect(
        setting["run"],
        setting["plan"],
        setting["op_id"],
        setting["workspace"],
        {},
        setting["envelope"],
        setting["shipper"],
    )


def test_an_effects_values_go_the_way_a_commands_do_and_it_succeeds_with_them(setting, monkeypatch):
    # Given a kind that records an id before its effect and returns its state
    kind = _Kind()
    monkeypatch.setitem(registry.KINDS, "s3_object", lambda spec, plan, endpoints: kind)

    # When the agent runs the stage
    ending = _effect(setting)

    # Then the values were journaled, recorded on the stage and logged as they came, and the stage
    # succeeded with them
    assert setting["recorded"] == [{"upload_id": "u-1"}, {"upload_id": "u-1", "apple_state": "VALID"}]
    local = setting["journal"].get(setting["op_id"])
    assert local.outputs == {"upload_id": "u-1", "apple_state": "VALID"}
    assert "[relevo] output upload_id=u-1" in setting["shipper"].lines
    assert "[relevo] output apple_state=VALID" in setting["shipper"].lines
    assert ending.error is None and ending.exit_code == 0
    assert ending.receipt["outputs"] == {"upload_id": "u-1", "apple_state": "VALID"}


@pytest.mark.parametrize(
    ("error_class", "outcome"),
    [(ErrorClass.NETWORK_TIMEOUT, AttemptOutcome.UNKNOWN), (ErrorClass.EFFECT_REFUSED, None)],
    ids=["transient: the retry probes first", "refused: failed for good"],
)
def test_an_effects_failure_is_the_stages_with_its_class(setting, monkeypatch, error_class, outcome):
    # Given a kind that fails with a class
    monkeypatch.setitem(
        registry.KINDS,
        "s3_object",
        lambda spec, plan, endpoints: _Kind(EffectFailed(error_class, "Apple said no")),
    )

    # When the agent runs the stage
    ending = _effect(setting)

    # Then the stage fails with that class, saying why; a transient one leaves its outcome unknown
    assert ending.error is error_class and ending.stage_outcome is outcome
    assert json.loads(ending.cause)["why"] == "Apple said no"
    assert ending.receipt["outputs"] == {"upload_id": "u-1"}
    assert f"[relevo] {error_class.value}: Apple said no" in setting["shipper"].lines


def test_an_effect_whose_file_is_not_there_fails_before_the_kind_is_asked(setting, monkeypatch):
    # Given the handed-on file missing
    kind = _Kind()
    monkeypatch.setitem(registry.KINDS, "s3_object", lambda spec, plan, endpoints: kind)
    (setting["workspace"] / "build" / "App.zip").unlink()

    # When the agent runs the stage
    ending = _effect(setting)

    # Then it fails as a missing handoff, and nothing was performed
    assert ending.error is ErrorClass.HANDOFF_MISSING and kind.performed == 0


def test_a_kind_this_agent_does_not_have_is_refused(setting, monkeypatch):
    monkeypatch.delitem(registry.KINDS, "s3_object")
    ending = _effect(setting)
    assert ending.error is ErrorClass.EFFECT_REFUSED
    assert "cannot perform an effect of kind s3_object" in json.loads(ending.cause)["why"]


def test_the_effects_file_never_leads_out_of_the_workspace(tmp_path: Path):
    # Given a workspace with a file, and a link in it to a file outside
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "App.zip").write_bytes(b"app")
    (tmp_path / "secret.txt").write_text("outside")
    (workspace / "link.zip").symlink_to(tmp_path / "secret.txt")

    # Then the file inside resolves; the link out and a missing file are refused with their classes
    assert effect_file(workspace, "App.zip") == (workspace / "App.zip").resolve()
    with pytest.raises(FileProblem) as out:
        effect_file(workspace, "link.zip")
    assert out.value.error_class is ErrorClass.HANDOFF_PATH
    with pytest.raises(FileProblem) as missing:
        effect_file(workspace, "none.zip")
    assert missing.value.error_class is ErrorClass.HANDOFF_MISSING


def test_a_key_of_another_project_is_refused_before_it_is_asked_for(monkeypatch):
    # Given a client that would answer anything
    monkeypatch.setattr(agent_side, "client", lambda service: pytest.fail("Secrets Manager was asked"))

    # When the effect of project app asks for project other's key
    with pytest.raises(EffectFailed) as caught:
        ReleaseKeys("app").read("relevo/prod/_release/other/asc.json")

    # Then it is refused, naming why, and nothing was asked
    assert caught.value.error_class is ErrorClass.EFFECT_REFUSED
    assert "a stage reads its own project's release keys only" in caught.value.message


def test_a_key_read_is_masked_whole_and_line_by_line(monkeypatch):
    # Given a key whose private key spans lines
    pem = (
        "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49AgEGCCqGSM49\n"
        "AwEHBG0wawIBAQQg0123456789abcdef\n-----END"
    )
    secret = {"key_id": "K1", "private_key": pem}

    class _Secrets:
        def get_secret_value(self, SecretId: str) -> dict[str, str]:  # noqa: N803 - boto3's name
            return {"SecretString": json.dumps(secret)}

    monkeypatch.setattr(agent_side, "client", lambda service: _Secrets())
    keys = ReleaseKeys("app")
    mask = keys.masker(Masker(()))

    # When it is read and a line carries a piece of it
    assert keys.read("relevo/prod/_release/app/asc.json") == secret

    # Then the mask replaces every line of it, and the key id stays readable
    shown = mask("key K1: AwEHBG0wawIBAQQg0123456789abcdef")
    assert shown == "key K1: ******"


@pytest.mark.parametrize(
    ("answer", "action"),
    [
        (Answer.DONE, ReconcileAction.SUCCEEDED),
        (Answer.ABSENT, ReconcileAction.RERUN),
        (Answer.IN_PROGRESS, ReconcileAction.RESUME),
        (Answer.CANNOT_TELL, ReconcileAction.MANUAL_REVIEW),
    ],
)
def test_a_kinds_probe_answer_is_read_as_the_reconcile_tables(answer: Answer, action: ReconcileAction):
    # Given a kind's answer, with its evidence
    found = ProbeAnswer(answer, "s3://downloads/App.zip: etag e1")

    # When the reconcile decides on it for a stage with an effect (resumable by its kind)
    result = decide(OP, None, LOST, PRE, probe_result(found, OP, lambda text: text), resumable=True)

    # Then the decision is the answer's, the evidence kept
    assert result.action is action, result.evidence
    assert "s3://downloads/App.zip: etag e1" in result.evidence["probe_output"]


def test_a_kind_whose_module_this_agent_lacks_is_refused_not_raised(setting, monkeypatch):
    # Given a kind registered by a module name this agent does not have
    monkeypatch.setitem(registry.KINDS, "s3_object", registry._by_name("no_such_kind", "NoSuchEffect"))

    # When the agent runs the stage
    ending = _effect(setting)

    # Then the stage is refused, naming the kind, and nothing raised out of the attempt
    assert ending.error is ErrorClass.EFFECT_REFUSED
    assert "cannot perform an effect of kind s3_object" in json.loads(ending.cause)["why"]


class _Resumable(_Kind):
    def __init__(self) -> None:
        super().__init__()
        self.resumed: list[dict[str, str]] = []

    def resume(self, context: EffectContext, recorded: Any) -> dict[str, str]:
        self.resumed.append(dict(recorded))
        return {"apple_state": "VALID"}


def test_an_effect_in_progress_is_resumed_with_the_previous_values_never_performed(setting, monkeypatch):
    # Given a kind, and a reconcile that found the previous attempt's upload in progress
    from relevo_agent.reconcile import Resumption

    kind = _Resumable()
    monkeypatch.setitem(registry.KINDS, "s3_object", lambda spec, plan, endpoints: kind)

    # When the agent runs the stage with that resumption
    ending = setting["command"].effect(
        setting["run"],
        setting["plan"],
        setting["op_id"],
        setting["workspace"],
        {},
        setting["envelope"],
        setting["shipper"],
        Resumption(None, {"upload_id": "u-0"}),
    )

    # Then the kind resumed the recorded upload, never performed a new one, and the previous
    # values were carried on as this attempt's own, recorded before the wait
    assert kind.performed == 0 and kind.resumed == [{"upload_id": "u-0"}]
    assert setting["recorded"][0] == {"upload_id": "u-0"}
    assert ending.error is None
    assert ending.receipt["outputs"] == {"upload_id": "u-0", "apple_state": "VALID"}
