"""A probe's four answers (issue 44, point 1): done (exit 0), absent (exit 1), in progress (exit
118: the stage's effect_resume runs, never its command) and cannot tell (anything else, a
timeout, a signal: a person looks, nothing runs); the project field that declares the resume, and
what a person reads of a resumed stage."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from relevo_agent.logs import Masker
from relevo_agent.reconcile import PROBE_IN_PROGRESS, ProbeResult, ReconcileAction, decide
from relevo_cli.job_view import job_notes
from relevo_core.jobs.reconciliations import decided_by_reconcile, reconciled_line
from relevo_core.jobs.view import job_items_to_view
from relevo_core.models.envelope import validation_error
from relevo_core.models.errors import ErrorCode, RelevoError
from relevo_core.models.project import Project
from relevo_core.plan_limits import MAX_COMMAND_BYTES, require_project_fits
from relevo_core.store.keys import JOB_SK, stage_sk
from tests.unit.test_envelope import minimal_envelope

OP = "job_1:notarize"
PRE = "commit=abc;inputs=00"
# The stage record as a previous attempt left it when its Mac died mid-stage.
LOST = {"attempt": 1, "agent_id": "mac-a", "precondition_version": PRE}
# A probe that timed out is handed to decide as -1; one killed by a signal as Popen gives it.
TIMED_OUT, SIGNALED = -1, -15


def _probe(exit_code: int, output: str) -> ProbeResult:
    return ProbeResult.masked(exit_code, output, Masker(()))


@pytest.mark.parametrize(
    ("exit_code", "output", "action"),
    [
        (0, f'{{"status": "Accepted", "name": "App-{OP}.zip"}}', ReconcileAction.SUCCEEDED),
        (1, "no submission recorded", ReconcileAction.RERUN),
        (PROBE_IN_PROGRESS, f'{{"status": "In Progress", "name": "App-{OP}.zip"}}', ReconcileAction.RESUME),
        (2, "Error: HTTP status code: 503", ReconcileAction.MANUAL_REVIEW),
        # 3 is jq's compile error and curl's malformed URL: a probe failing on its way, not "in progress".
        (3, f"jq: error: syntax error; {OP}", ReconcileAction.MANUAL_REVIEW),
        (TIMED_OUT, "", ReconcileAction.MANUAL_REVIEW),
        (SIGNALED, f"App-{OP}.zip", ReconcileAction.MANUAL_REVIEW),
    ],
    ids=["done", "absent", "in progress", "cannot tell", "exit 3", "timeout", "signal"],
)
def test_the_four_answers_of_a_probe(exit_code: int, output: str, action: ReconcileAction):
    # Given a stage that declares an effect_resume, whose previous attempt's outcome is unknown
    # When its probe answers
    result = decide(OP, None, LOST, PRE, _probe(exit_code, output), resumable=True)

    # Then the decision is the answer's, with the probe's exit and output as the evidence
    assert result.action is action, result.evidence
    assert (result.evidence["probe_exit"], result.evidence["probe_output"]) == (exit_code, output)
    assert result.receipt is None or action is ReconcileAction.SUCCEEDED


def test_an_effect_in_progress_is_resumed_even_after_the_precondition_moved():
    # Given a submission started under the old inputs, still being checked
    probe = _probe(PROBE_IN_PROGRESS, f"In Progress App-{OP}.zip")

    # When the inputs changed since (a new commit on the branch)
    result = decide(OP, None, LOST, "commit=def;inputs=11", probe, resumable=True)

    # Then it is waited for, as a done one counts: it was started, starting it again is the harm
    assert result.action is ReconcileAction.RESUME


def test_an_effect_in_progress_without_a_resume_waits_for_a_person_never_runs_again():
    # Given a stage with a probe and no effect_resume
    probe = _probe(PROBE_IN_PROGRESS, f"In Progress App-{OP}.zip")

    # When its probe says the previous attempt's effect is in progress
    result = decide(OP, None, LOST, PRE, probe)

    # Then a person decides, and the reason says why the stage was not run again
    assert result.action is ReconcileAction.MANUAL_REVIEW
    assert "no effect_resume" in result.evidence["why"]
    assert "second one" in result.evidence["why"]


def test_an_effect_in_progress_that_does_not_name_the_operation_waits_for_a_person():
    # Given a probe that finds some submission in progress, not this operation's
    probe = _probe(PROBE_IN_PROGRESS, "In Progress App-job_0:notarize.zip")

    # When decided, then nothing is resumed
    result = decide(OP, None, LOST, PRE, probe, resumable=True)
    assert result.action is ReconcileAction.MANUAL_REVIEW
    assert "does not name this operation" in result.evidence["why"]


BASE = {"id": "app", "repo": "acme/app", "region_affinity": "eu-west"}


def test_a_resume_without_a_probe_is_refused_naming_the_field():
    # Given a project file whose stage declares effect_resume and no effect_probe
    body = {**BASE, "stages": [{"name": "notarize", "run": "submit.sh", "effect_resume": "wait.sh"}]}

    # When it is validated
    with pytest.raises(ValidationError) as refused:
        Project.model_validate(body)
    error = validation_error(refused.value)

    # Then VALIDATION_FAILED names the stage's effect_resume and says what is missing
    assert error.code is ErrorCode.VALIDATION_FAILED
    [problem] = [p for p in error.details["problems"] if p["field"].endswith("effect_resume")]
    assert problem["field"] == "stages.0.effect_resume"
    assert "effect_resume needs an effect_probe" in problem["problem"]


def test_a_resume_is_frozen_into_the_plan_and_bounded_like_a_command():
    # Given a stage with a probe and a resume
    stage = {"name": "notarize", "run": "submit.sh", "effect_probe": "probe.sh", "effect_resume": "wait.sh"}

    # When frozen into a job's plan, then the resume travels with it
    (plan,) = Project.model_validate({**BASE, "stages": [stage]}).frozen_stages()
    assert plan.effect_resume == "wait.sh"

    # And one byte over a command's limit is refused as PLAN_TOO_LARGE, naming the field
    big = Project.model_validate(
        {**BASE, "stages": [{**stage, "effect_resume": "w" * (MAX_COMMAND_BYTES + 1)}]}
    )
    with pytest.raises(RelevoError) as refused:
        require_project_fits(big)
    assert refused.value.code is ErrorCode.PLAN_TOO_LARGE
    assert refused.value.details["limit"] == "effect_resume_bytes"
    assert "stages.0.effect_resume" in refused.value.message


RESUMED_ENTRY = {
    "attempt": 2,
    "agent_id": "mac-t1",
    "decision": "resume",
    "evidence": {"previous_attempt": 1, "probe_exit": PROBE_IN_PROGRESS, "probe_output": "In Progress"},
    "at": "2026-12-03T10:00:11+00:00",
}
SAID = (
    "notarize#2 reconciled on mac-t1: the effect of attempt 1 is in progress (probe exit 118); resumed "
    "under the same operation id (its effect_resume, not its command)"
)


def _view(stage_record: dict[str, Any]) -> dict[str, Any]:
    stages = [{"name": "notarize", "command": "submit.sh", "effect_probe": "p"}]
    items = [
        {"pk": "JOB#x", "sk": JOB_SK, "status": "succeeded", "envelope": minimal_envelope(stages=stages)},
        {"pk": "STAGES#x", "sk": stage_sk(0), **stage_record},
    ]
    return job_items_to_view(items)


def test_a_resumed_stage_is_said_resumed_and_shows_its_own_result():
    # Given a notarize stage whose attempt 2 found attempt 1's submission in progress and resumed it
    record = {
        "stage_name": "notarize",
        "status": "succeeded",
        "attempt": 2,
        "agent_id": "mac-t1",
        "exit_code": 0,
        "reconciled": RESUMED_ENTRY,
        "reconciliations": [RESUMED_ENTRY],
    }

    # When `relevo job view` says it
    view = _view(record)

    # Then a note says what the probe found and what ran, and the stage's result is the resume's own
    assert reconciled_line("notarize", RESUMED_ENTRY) == SAID
    assert SAID in job_notes(view)
    assert decided_by_reconcile(view["stages"][0]) is None
