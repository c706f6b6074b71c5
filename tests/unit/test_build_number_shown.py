"""A job's build number (RELEVO_BUILD_NUMBER) where people look: `relevo job view`, `relevo job
list`, the console's job page and the notification of the job's transitions."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from rich.console import Console

from relevo_cli.commands.jobs import _job_rows
from relevo_cli.console.render import templates
from relevo_cli.console.summary import job_summary
from relevo_cli.job_view import job_notes
from relevo_core.notify.groups import job_notices
from relevo_core.notify.messages import slack_message
from relevo_core.notify.transitions import job_transition, transition_from_event
from tests.unit.test_console_summary import JOB, NOW


def _text(renderable) -> str:
    console = Console(width=250, record=True)
    console.print(renderable)
    return console.export_text()


def test_the_cli_says_the_jobs_build_number_in_its_view_and_its_row():
    # Given a job that took build number 1207, and one that has none yet
    numbered = {**JOB, "region_affinity": "eu-west", "build_number": 1207}
    listing = {
        "count": 2,
        "truncated": False,
        "jobs": [
            {
                **{key: numbered.get(key) for key in ("job_id", "project", "status", "ref", "commit")},
                "trigger": "api",
                "region_affinity": "eu-west",
                "priority": 0,
                "created_at": datetime.now(UTC).isoformat(),
                "last_successful_stage": None,
                "build_number": number,
            }
            for number in (1207, None)
        ],
    }
    # When the CLI shows them
    notes = job_notes(numbered)
    rows = _text(_job_rows(listing, queued=False))
    # Then the view says it beside the ref and the region, and the list has a column for it
    assert "build number 1207" in notes[0], notes
    assert "build" in rows.splitlines()[1] + rows.splitlines()[2] and "1207" in rows, rows
    assert "build number" not in job_notes({**numbered, "build_number": None})[0]


def test_the_consoles_job_page_shows_the_build_number():
    html = templates.get_template("job_parts.html").render(
        job={**JOB, "build_number": 1207},
        buttons=[],
        rerun_from=None,
        caller="arn:x",
        level="manage",
        summary=job_summary(JOB, None, NOW),
    )
    assert '<dt>Build number</dt><dd id="job-build-number">1207</dd>' in html


def test_the_notification_of_a_numbered_job_names_its_build_number():
    # Given a job record that took build number 42 and just succeeded
    old = {"pk": "JOB#j", "sk": "JOB", "status": "running", "job_id": "job_0000000000000000000000a"}
    new = {
        **old,
        "status": "succeeded",
        "project": "ios-app",
        "updated_at": "t2",
        "build_number": 42,
        "envelope": {"ref": "main", "commit": "a" * 40, "trigger": {"type": "webhook", "source": "github"}},
    }
    transition = job_transition(old, new)
    assert transition is not None
    # When its notice is made (and when it is replayed from a dead-lettered report)
    [(notice, _)] = job_notices(transition, "https://x/jobs/j")
    replayed = transition_from_event(transition.as_event())
    # Then its facts, its Slack message and the replayed transition carry the number
    assert ("Build number", "42") in notice.facts()
    assert "*Build number*\n42" in json.dumps(slack_message(notice), ensure_ascii=False).replace("\\n", "\n")
    assert replayed is not None and replayed.build_number == 42
