"""statemachines/job.asl.json and job_run.asl.json are what tools/relevo_tools/job_machine builds,
every DynamoDB transaction in them retries a conflict, and the builder spells neither a transaction
nor a key by hand."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from relevo_tools.job_machine import asl, render
from relevo_tools.job_machine.__main__ import main
from relevo_tools.job_machine.machine import build, build_run, reachable

ROOT = Path(__file__).resolve().parents[2]
ASL = ROOT / "statemachines" / "job.asl.json"
RUN_ASL = ROOT / "statemachines" / "job_run.asl.json"
BUILDER = ROOT / "tools" / "relevo_tools" / "job_machine"


def _scopes(states: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The machine's states, and those of every Map's item processor, one scope at a time."""
    yield states
    for state in states.values():
        if state["Type"] == "Map":
            yield from _scopes((state.get("ItemProcessor") or state["Iterator"])["States"])


def _transactions() -> Iterator[tuple[dict[str, Any], str, dict[str, Any]]]:
    for scope in _scopes(json.loads(ASL.read_text())["States"]):
        for name, state in scope.items():
            if state.get("Resource", "").startswith(asl.TRANSACT_WRITE):
                yield scope, name, state


def test_the_committed_definition_is_the_builders_output():
    assert ASL.read_text() == render(), (
        "statemachines/job.asl.json was edited by hand: run python -m relevo_tools.job_machine"
    )
    assert RUN_ASL.read_text() == render(build_run), (
        "statemachines/job_run.asl.json was edited by hand: run python -m relevo_tools.job_machine"
    )


def test_the_run_definition_is_the_queued_ones_stages_and_ending_from_run_stages():
    """job_run.asl.json (a job whose intake took its project's lock) starts at RunStages and has
    exactly the states of job.asl.json that RunStages leads to, each the same: no lock is taken or
    waited for, and none of its states is unreachable (Step Functions refuses such a definition)."""
    queued, run = build(), build_run()
    assert run["StartAt"] == "RunStages" and queued["StartAt"] == "AcquireProjectLockAndStart"
    assert run["States"] == reachable(queued["States"], "RunStages")
    assert {name: queued["States"][name] for name in run["States"]} == run["States"]
    assert not {"AcquireProjectLockAndStart", "WaitForProject", "MarkStarted"} & set(run["States"])
    assert {"ReleaseLockAndMarkSucceeded", "MarkFailed", "ReleaseProjectLockAfterFailure"} <= set(
        run["States"]
    )
    assert reachable(run["States"], "RunStages") == run["States"]


def test_the_cli_writes_each_definition_by_its_name(tmp_path):
    run = tmp_path / "job_run.asl.json"
    assert main([str(run)]) == 0 and run.read_text() == render(build_run)


def test_check_says_whether_a_file_differs(tmp_path, capsys):
    current = tmp_path / "job.asl.json"
    current.write_text(render())
    assert main(["--check", str(current)]) == 0
    current.write_text(render().replace("RunStages", "RunTheStages"))
    assert main(["--check", str(current)]) == 1
    assert "python -m relevo_tools.job_machine" in capsys.readouterr().err
    assert main([str(current)]) == 0 and current.read_text() == render()


def test_every_transaction_retries_a_conflict():
    """A transaction with a condition tells a conflict from a refusal and retries the conflict
    with backoff (`<name>Canceled` → `<name>ConflictBackoff` → `<name>ConflictWait` → itself);
    one without any condition retries every cancellation."""
    found = list(_transactions())
    assert len(found) >= 7, [name for _, name, _ in found]
    for scope, name, state in found:
        items = [next(iter(item.values())) for item in state["Parameters"]["TransactItems"]]
        catch = [c for c in state.get("Catch", []) if asl.TRANSACTION_CANCELED in c["ErrorEquals"]]
        if not catch:
            assert not any("ConditionExpression" in item for item in items), (
                f"{name}: a refusable transaction without its Canceled choice"
            )
            assert any(asl.TRANSACTION_CANCELED in r["ErrorEquals"] for r in state.get("Retry", [])), (
                f"{name}: a cancellation is not retried"
            )
            continue
        assert catch[0]["Next"] == f"{name}Canceled", name
        canceled = scope[f"{name}Canceled"]
        first = canceled["Choices"][0]
        assert (
            first["Next"] == f"{name}ConflictBackoff"
            and {"Variable": "$.conflict.retries", "NumericLessThan": asl.CONFLICT_RETRIES} in first["And"]
        )
        assert {c["StringMatches"] for c in first["And"][0]["Or"]} == {
            f"*{reason}*" for reason in asl.CONFLICT_REASONS
        }
        assert scope[f"{name}ConflictBackoff"]["Next"] == f"{name}ConflictWait"
        assert scope[f"{name}ConflictWait"] == {
            "Type": "Wait",
            "SecondsPath": "$.conflict.delay_sec",
            "Next": name,
        }


def test_only_the_transaction_helper_writes_a_transaction_or_its_retry():
    """No conflict-retry block (nor a TransactWriteItems task) is written by hand: asl.transaction is the one
    place."""
    spelled = re.compile(r"TransactionCanceled|ConflictBackoff|ConflictWait|transactWriteItems|TransactItems")
    by_hand = {
        path.name: spelled.findall(path.read_text()) for path in BUILDER.glob("*.py") if path.name != "asl.py"
    }
    assert not any(by_hand.values()), by_hand


def test_the_builder_spells_no_key_format():
    """Key formats come from relevo_core.store.keys: no `PREFIX#` literal in the builder."""
    literals = {path.name: re.findall(r"['\"][A-Z_]+#", path.read_text()) for path in BUILDER.glob("*.py")}
    assert not any(literals.values()), literals
    assert (
        "States.Format('JOB#{}', $.job_id)" in ASL.read_text()
    )  # ...and still the same keys in the definition


def test_the_stage_message_body_is_derived_from_the_model_and_a_field_without_a_source_fails_the_build(
    monkeypatch,
):
    """The dispatch's MessageBody is relevo_core.models.stage_message.StageMessage, field by field:
    a field the model gains without a source in the builder stops the build, it is never left out."""
    # Given the builder's message as it stands
    from relevo_core.models.stage_message import StageMessage
    from relevo_tools.job_machine import dispatch

    assert list(dispatch.message_body(shard=True)) == [f"{name}.$" for name in StageMessage.model_fields]
    assert "shard.$" not in dispatch.message_body(shard=False)
    # When the model has a field the builder has no source for
    monkeypatch.setattr(dispatch, "MESSAGE_SOURCES", {**dispatch.MESSAGE_SOURCES})
    del dispatch.MESSAGE_SOURCES["requires"]
    # Then the build refuses, naming it
    with pytest.raises(ValueError, match="without a source \\['requires'\\]"):
        render()
