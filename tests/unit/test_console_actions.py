"""The job page's buttons (issue 18, point 4): each calls the route the CLI calls, needs the level
that route declares in functions/ (read from the handlers, so the two cannot drift), and a
button the caller may not use says why."""

from __future__ import annotations

import re

from relevo_cli.console.actions import ACTIONS, REDRIVE, RERUN_FROM, SET_PRIORITY, button_state
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
    for action in (*ACTIONS, RERUN_FROM, SET_PRIORITY, REDRIVE):
        assert declared[action.route] is action.level, action


def test_the_buttons_have_the_issues_accessible_names():
    assert [a.label for a in ACTIONS] + [RERUN_FROM.label] == [
        "Approve", "Reject", "Promote", "Cancel job", "Rerun", "Delete", "Rerun from this stage"]


JOB = {"job_id": "j-1", "project": "app", "status": "waiting"}
VIEWER = "arn:aws:iam::123456789012:user/viewer"


def test_a_button_the_caller_may_not_use_says_which_level_it_needs():
    approve = next(a for a in ACTIONS if a.name == "approve")
    assert button_state(approve, JOB, VIEWER, Level.VIEW) == f"{VIEWER} has view on project app; Approve needs operate"
    assert button_state(approve, JOB, VIEWER, None) == f"{VIEWER} has no grant on project app; Approve needs operate"
    assert button_state(approve, JOB, VIEWER, Level.OPERATE) is None


def test_a_button_the_jobs_state_rules_out_says_so():
    cancel = next(a for a in ACTIONS if a.name == "cancel")
    rerun = next(a for a in ACTIONS if a.name == "rerun")
    assert button_state(cancel, {**JOB, "status": "succeeded"}, VIEWER, Level.MANAGE) == "the job already ended (succeeded)"
    assert button_state(rerun, JOB, VIEWER, Level.MANAGE) == "only when the job is ended (it is waiting)"
    assert button_state(cancel, JOB, VIEWER, Level.MANAGE) is None
