"""The job page's buttons (issue 18, point 4): each calls the route the CLI calls, needs the level
that route declares in functions/ (read from the handlers, so the two cannot drift), and a
button the caller may not use says why."""

from __future__ import annotations

import re

from relevo_cli.console.actions import (
    ACTIONS,
    REDRIVE,
    RERUN_FROM,
    RERUN_FROM_CURRENT,
    SET_PRIORITY,
    button_state,
    row_buttons,
    stopped_stage,
)
from relevo_core.models.access import Level
from tests.helpers import ROOT

ROUTE = re.compile(r'@app\.(get|post|put|delete)\("([^"]+)", middlewares=\[requires\(Level\.([A-Z]+)')


def declared_levels() -> dict[str, Level]:
    found = {}
    for handler in (ROOT / "functions").glob("*/handler.py"):
        for method, path, level in ROUTE.findall(handler.read_text()):
            found[f"{method.upper()} {path.replace('<', '{').replace('>', '}')}"] = Level(level.lower())
    return found


def test_every_button_needs_the_level_its_api_route_declares():
    declared = declared_levels()
    assert declared, "no routes read from functions/*/handler.py"
    # (Unfreeze checks manage inside its route, on the key's project: relevo_core.recovery.key_freeze.)
    for action in (*ACTIONS, RERUN_FROM, RERUN_FROM_CURRENT, SET_PRIORITY, REDRIVE):
        assert declared[action.route] is action.level, action


def test_the_buttons_have_the_issues_accessible_names():
    assert [a.label for a in ACTIONS] + [RERUN_FROM.label] == [
        "Approve",
        "Reject",
        "Promote",
        "Cancel job",
        "Rerun",
        "Delete",
        "Rerun from this stage",
    ]


JOB = {"job_id": "j-1", "project": "app", "status": "waiting"}
VIEWER = "arn:aws:iam::123456789012:user/viewer"


def test_a_button_the_caller_may_not_use_says_which_level_it_needs():
    approve = next(a for a in ACTIONS if a.name == "approve")
    assert (
        button_state(approve, JOB, VIEWER, Level.VIEW)
        == f"{VIEWER} has view on project app; Approve needs operate"
    )
    assert (
        button_state(approve, JOB, VIEWER, None)
        == f"{VIEWER} has no grant on project app; Approve needs operate"
    )
    assert button_state(approve, JOB, VIEWER, Level.OPERATE) is None


def test_a_button_the_jobs_state_rules_out_says_so():
    cancel = next(a for a in ACTIONS if a.name == "cancel")
    rerun = next(a for a in ACTIONS if a.name == "rerun")
    assert (
        button_state(cancel, {**JOB, "status": "succeeded"}, VIEWER, Level.MANAGE)
        == "the job already ended (succeeded)"
    )
    assert button_state(rerun, JOB, VIEWER, Level.MANAGE) == "only when the job is ended (it is waiting)"
    assert button_state(cancel, JOB, VIEWER, Level.MANAGE) is None


PLAN = ["build", "sign", "deploy"]


def test_the_job_lists_rerun_starts_from_the_stage_the_job_stopped_at():
    failed = {**JOB, "status": "failed"}
    assert stopped_stage({**failed, "last_successful_stage": "build"}, PLAN) == ("sign", None)
    assert stopped_stage({**failed, "last_successful_stage": None}, PLAN) == ("build", None)
    assert stopped_stage({**JOB, "status": "succeeded", "last_successful_stage": "deploy"}, PLAN) == (
        None,
        "every stage succeeded: nothing after the last one",
    )
    assert stopped_stage({**failed, "last_successful_stage": "lint"}, PLAN) == (
        None,
        "the project's plan no longer has stage lint",
    )


def test_a_job_list_row_offers_every_action_in_the_issues_order():
    buttons = row_buttons(
        {**JOB, "status": "failed", "last_successful_stage": "build"}, VIEWER, Level.MANAGE, PLAN
    )
    assert [b["action"].label for b in buttons] == [
        "Approve",
        "Reject",
        "Promote",
        "Cancel job",
        "Rerun",
        "Rerun from the current stage",
        "Delete",
    ]
    assert {b["action"].label: b["why_not"] for b in buttons if b["why_not"] is None} == {
        "Rerun": None,
        "Rerun from the current stage": None,
        "Delete": None,
    }
    assert [b["from_stage"] for b in buttons if b["action"] is RERUN_FROM_CURRENT] == ["sign"]
    viewer = row_buttons({**JOB, "status": "failed"}, VIEWER, Level.VIEW, PLAN)
    assert all(b["why_not"] for b in viewer), viewer
