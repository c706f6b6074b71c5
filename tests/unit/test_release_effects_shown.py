"""A stage's built-in release effect where the people who ship look (issue 44, point 6): the job
view's typed `effect` (kind, the identifiers the kind recorded, Apple's state, a line in words, and
for a stage held for review the reconcile's evidence), `relevo job view`'s release section, the
console's job page, the notification and the commit status (within GitHub's 140 characters)."""

from __future__ import annotations

import json
from typing import Any

from relevo_cli.console.render import templates
from relevo_cli.console.summary import job_summary
from relevo_cli.job_view import release_section, view
from relevo_core.jobs.view import job_items_to_view
from relevo_core.models.effect_summary import effect_words
from relevo_core.models.job_view import JobView
from relevo_core.notify.commit_status import DESCRIPTION_LIMIT, describe
from relevo_core.notify.groups import job_notices
from relevo_core.notify.messages import email_message, slack_message
from relevo_core.notify.transitions import job_transition, transition_from_event, with_stage_records
from relevo_core.store.keys import JOB_SK, stage_sk
from tests.unit.test_console_summary import NOW
from tests.unit.test_envelope import minimal_envelope

KEY = "relevo/prod/_release/demo/asc-key"
STAGES = [
    {"name": "build", "command": "make ipa"},
    {
        "name": "upload",
        "effect": {"kind": "app_store_upload", "file": "App.ipa", "app_id": "1234567890", "api_key": KEY},
    },
    {"name": "notarize", "effect": {"kind": "notarization", "file": "App.dmg", "api_key": KEY}},
]
SUBMISSION = "2efe41c0-6b3d-4a8e-9f7e-0c1d2e3f4a5b"
SHA = "ab" * 32
UPLOADED = {
    "app_id": "1234567890",
    "build_version": "1.4.0",
    "build_number": "42",
    "sha256": SHA,
    "upload_id": "7d1c0f2e-0000-4000-8000-000000000042",
    "apple_state": "VALID",
}
NOTARIZED = {
    "sha256": SHA,
    "submission_name": "Relevo-1.4.abababababababab.job_x.notarize.dmg",
    "submission_id": SUBMISSION,
    "apple_state": "Accepted",
    "stapled": "true",
}
EVIDENCE = f"upload 7d1c0f2e of 1.4.0 (42), sha256 {SHA[:12]}: another file's upload (operation job_x:upload)"
HELD = {
    "attempt": 2,
    "agent_id": "mac-t1",
    "decision": "manual_review",
    "evidence": {"previous_attempt": 1, "probe_exit": 2, "probe_output": EVIDENCE},
    "at": "2026-12-03T10:00:11+00:00",
}


def _records(upload: dict[str, Any], notarize: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"pk": "STAGES#x", "sk": stage_sk(0), "stage_name": "build", "status": "succeeded", "attempt": 1},
        {"pk": "STAGES#x", "sk": stage_sk(1), "stage_name": "upload", **upload},
        {"pk": "STAGES#x", "sk": stage_sk(2), "stage_name": "notarize", **notarize},
    ]


def _view(upload: dict[str, Any], notarize: dict[str, Any], status: str = "running") -> dict[str, Any]:
    envelope = minimal_envelope(stages=STAGES)
    items = [
        {"pk": "JOB#x", "sk": JOB_SK, "status": status, "envelope": envelope},
        *_records(upload, notarize),
    ]
    # As the API answers it: JobView's own fields (the view adds the log and artifacts beside these).
    return JobView.model_validate(job_items_to_view(items)).model_dump(mode="json")


UPLOAD_DONE = {"status": "succeeded", "attempt": 1, "receipt": {"exit_code": 0, "outputs": UPLOADED}}
# A notarization under way: its id recorded, Apple still checking it.
NOTARIZING = {
    "status": "running",
    "attempt": 1,
    "outputs": {**NOTARIZED, "apple_state": "In Progress", "stapled": ""},
}
NOTARIZE_HELD = {
    "status": "manual_review",
    "attempt": 2,
    "outputs": {key: NOTARIZED[key] for key in ("sha256", "submission_name")},
    "reconciled": HELD,
    "reconciliations": [HELD],
}


def test_the_job_view_gives_each_effect_stage_its_kind_identifiers_and_apples_state():
    # Given a job whose upload is VALID and whose notarization is In Progress
    job = _view(UPLOAD_DONE, NOTARIZING)

    # When the API's view of it is read
    build, upload, notarize = job["stages"]

    # Then a stage without an effect has none, and each effect stage says its kind, ids and state
    assert build["effect"] is None
    assert upload["effect"] == {
        "kind": "app_store_upload",
        "identifiers": {
            key: UPLOADED[key] for key in ("app_id", "build_version", "build_number", "upload_id", "sha256")
        },
        "state": "VALID",
        "words": "uploaded build 42 (VALID)",
        "evidence": None,
    }
    assert notarize["effect"]["identifiers"]["submission_id"] == SUBMISSION
    assert notarize["effect"]["state"] == "In Progress"
    assert notarize["effect"]["words"] == "notarization In Progress (submission 2efe41c0…)"


def test_a_stage_held_for_review_shows_the_reconciles_evidence():
    # Given a notarize stage whose probe could not tell, waiting for a person
    job = _view(UPLOAD_DONE, NOTARIZE_HELD)

    # When the view and `relevo job view` say it
    effect = job["stages"][2]["effect"]
    section = release_section(job)

    # Then the evidence is the probe's, on the view and in the release section under the stage
    assert effect["evidence"] == EVIDENCE and effect["words"] == "notarization not submitted yet"
    assert "notarize (notarization, manual_review): notarization not submitted yet" in section
    assert f"  held for review: {EVIDENCE}" in section


def test_relevo_job_view_has_a_release_section_per_effect_stage():
    # Given the job with its upload done and its notarization accepted and stapled
    job = _view(
        UPLOAD_DONE, {"status": "succeeded", "attempt": 1, "receipt": {"outputs": NOTARIZED}}, "succeeded"
    )

    # When `relevo job view` renders it
    shown = [part for part in view({**job, "log_tail": None}) if isinstance(part, str)]

    # Then a release section names each effect, its identifiers whole, and Apple's state
    start = shown.index("── release ──")
    assert shown[start + 1] == "upload (app_store_upload, succeeded): uploaded build 42 (VALID)"
    assert f"  upload_id {UPLOADED['upload_id']}" in shown and "  build_number 42" in shown
    assert "  Apple's state VALID" in shown
    notarized = "notarize (notarization, succeeded): notarized (Accepted, submission 2efe41c0…, stapled)"
    assert notarized in shown and f"  submission_id {SUBMISSION}" in shown
    assert "  Apple's state Accepted" in shown
    # And a job without an effect has no release section
    assert release_section({"stages": [{**job["stages"][0]}]}) == []


def test_the_consoles_job_page_has_a_release_table():
    # Given the job with its notarization held for review
    job = _view(UPLOAD_DONE, NOTARIZE_HELD)

    # When its page's parts are rendered
    html = templates.get_template("job_parts.html").render(
        job=job,
        buttons=[],
        rerun_from=None,
        caller="arn:x",
        level="manage",
        summary=job_summary(job, None, NOW),
    )

    # Then a Release table has a row per effect stage with its words, Apple's state and identifiers
    assert "<h2>Release</h2>" in html
    assert '<tr data-stage="upload" data-effect="app_store_upload">' in html
    assert '<td class="effect-words">uploaded build 42 (VALID)</td>' in html
    assert '<td class="apple-state">VALID</td>' in html
    assert f'<span title="{UPLOADED["upload_id"]}">{UPLOADED["upload_id"]}</span>' in html
    # And the held stage says so, with the probe's evidence (escaped as HTML)
    assert "held for review</span>" in html
    assert f"the reconcile's probe found: {EVIDENCE.replace(chr(39), '&#39;')}" in html


def _ended(upload: dict[str, Any], notarize: dict[str, Any]):
    old = {"pk": "JOB#x", "sk": "JOB", "status": "running", "job_id": "job_x"}
    new = {
        **old,
        "status": "succeeded",
        "project": "demo",
        "updated_at": "2026-12-03T10:05:00+00:00",
        "build_number": 42,
        "envelope": minimal_envelope(stages=STAGES, commit="c" * 40),
    }
    transition = job_transition(old, new)
    assert transition is not None
    return with_stage_records(transition, _records(upload, notarize), [])


def test_the_notification_names_each_release_effect_and_where_it_stands():
    # Given the job's end, its upload VALID and its notarization accepted
    told = _ended(UPLOAD_DONE, {"status": "succeeded", "attempt": 1, "receipt": {"outputs": NOTARIZED}})

    # When its notice is made, and when a dead-lettered report of it is replayed
    [(notice, _)] = job_notices(told, "https://console/jobs/job_x")
    replayed = transition_from_event(json.loads(json.dumps(told.as_event())))

    # Then the Slack message and the email say each effect, stage by stage
    lines = [
        "upload: uploaded build 42 (VALID)",
        "notarize: notarized (Accepted, submission 2efe41c0…, stapled)",
    ]
    assert list(notice.notes[:2]) == lines
    slack = json.dumps(slack_message(notice), ensure_ascii=False)
    assert all(line in slack for line in lines) and all(line in email_message(notice)[1] for line in lines)
    assert replayed is not None and replayed.released == told.released


def test_the_commit_status_says_the_effects_first_within_githubs_140_characters():
    # Given the job's end, its upload VALID and its notarization accepted
    told = _ended(UPLOAD_DONE, {"status": "succeeded", "attempt": 1, "receipt": {"outputs": NOTARIZED}})

    # When its commit status is described
    said = describe(told)

    # Then it says both effects after the status, within GitHub's limit
    assert said == "succeeded; uploaded build 42 (VALID); notarized (Accepted, submission 2efe41c0…, stapled)"
    assert len(said) <= DESCRIPTION_LIMIT

    # And with a reconciliation besides (a long line), it is cut to the limit, saying so with "…"
    from dataclasses import replace

    long = replace(told, reconciled=("upload#2 reconciled on mac-t1: " + "x" * 200,))
    cut = describe(long)
    assert len(cut) == DESCRIPTION_LIMIT and cut.endswith("…") and cut.startswith(said)


def test_each_kind_in_words_before_and_after_it_happened():
    assert effect_words("app_store_upload", {"build_number": "42"}) == "build 42 not uploaded yet"
    assert effect_words(
        "app_store_upload", {"build_number": "42", "upload_id": "u", "apple_state": "PROCESSING"}
    ) == ("uploading build 42 (PROCESSING)")
    assert effect_words(
        "app_store_upload", {"build_number": "42", "upload_id": "u", "apple_state": "FAILED"}
    ) == ("upload of build 42 FAILED")
    assert effect_words("notarization", {"submission_id": SUBMISSION, "apple_state": "Invalid"}) == (
        "notarization Invalid (submission 2efe41c0…)"
    )
    assert effect_words(
        "github_release_asset", {"asset_name": "App.dmg", "tag": "v1.4.0", "asset_id": "99"}
    ) == ("attached App.dmg to v1.4.0 (asset 99)")
    assert effect_words("s3_object", {"s3_uri": "s3://b/k", "etag": "e"}) == "put s3://b/k"


def test_a_stage_a_rerun_did_not_run_again_says_its_effect_is_in_the_job_it_reran():
    # Given a rerun from notarize of an earlier job (whose upload is that job's, not read here)
    earlier = "job_00loyw3v281z46n6ywoziqjl4n"
    envelope = minimal_envelope(stages=STAGES, from_stage="notarize", retry_of=earlier)
    items = [
        {"pk": "JOB#x", "sk": JOB_SK, "status": "running", "envelope": envelope},
        {"pk": "STAGES#x", "sk": stage_sk(2), "stage_name": "notarize", "status": "dispatched"},
    ]

    # When the view is read
    upload, notarize = job_items_to_view(items)["stages"][1:]

    # Then the upload's effect is said to be the earlier job's, and the notarization's not begun
    assert upload["status"] == "skipped"
    assert upload["effect"]["words"] == f"done in {earlier} (not run again)"
    assert notarize["effect"]["words"] == "notarization not submitted yet"


def test_an_effect_nothing_was_recorded_of_yet_says_so_without_placeholders():
    assert effect_words("app_store_upload", {}) == "the build not uploaded yet"
    assert effect_words("github_release_asset", {}) == "the asset not attached yet"
    assert effect_words("s3_object", {}) == "the object not put yet"
