"""The job page's summary and steps (issue 18, point 4): what is computed from the job view (start,
durations, bytes uploaded per stage) and how attempts and reconciliations are shown."""

from __future__ import annotations

import re
from datetime import UTC, datetime

from relevo_cli.console.render import templates
from relevo_cli.console.summary import artifact_type, format_duration, job_summary

NOW = datetime(2026, 12, 1, 12, 0, 30, tzinfo=UTC)


def _stage(name: str, index: int, **fields):
    return {
        "index": index,
        "name": name,
        "status": "pending",
        "attempts_log": [],
        "reconciled": None,
        "reconciliations": [],
        "resolution": None,
        "retry_count": 0,
        **fields,
    }


JOB = {
    "job_id": "j-1",
    "project": "app",
    "status": "running",
    "priority": 10,
    "ref": "main",
    "commit": None,
    "trigger": {"type": "api", "source": "api", "actor": "arn:aws:iam::123456789012:user/ana"},
    "created_at": "2026-12-01T11:59:00+00:00",
    "ended_at": None,
    "current_stage": "sign",
    "queue_reason": None,
    "stages": [
        _stage(
            "build",
            0,
            status="succeeded",
            agent_id="mac-1",
            attempt=2,
            started_at="2026-12-01T12:00:00+00:00",
            ended_at="2026-12-01T12:00:12+00:00",
            retry_count=1,
            attempts_log=[
                {
                    "attempt": 1,
                    "agent": "mac-2",
                    "error": "Relevo.Transient.ExitCode",
                    "cause": '{"exit_code": 75, "agent_id": "mac-2", "attempt": 1}',
                    "at": "2026-12-01T11:59:50+00:00",
                }
            ],
            reconciliations=[
                {
                    "attempt": 2,
                    "agent_id": "mac-1",
                    "decision": "rerun",
                    "evidence": {"probe_exit": 1},
                    "at": "2026-12-01T11:59:59+00:00",
                }
            ],
        ),
        _stage(
            "sign", 1, status="running", agent_id="mac-1", attempt=1, started_at="2026-12-01T12:00:13+00:00"
        ),
    ],
    "artifacts": [
        {"stage": "build", "name": "a.bin", "size": 1500, "sha256": "0" * 64},
        {"stage": "build", "name": "dir/b.txt", "size": 2, "sha256": "1" * 64},
    ],
}


def test_the_summary_counts_from_the_first_stages_start_and_sums_each_stages_uploads():
    summary = job_summary(JOB, None, NOW)
    assert (summary["started_at"], summary["duration_sec"], summary["queue_position"]) == (
        "2026-12-01T12:00:00+00:00",
        30,
        None,
    )
    assert summary["stage_sec"] == {"build": 12, "sign": 17}
    assert summary["transfers"] == {"build": "2 files, 1.5 KiB uploaded"}
    assert (
        job_summary({**JOB, "status": "queued", "stages": []}, {"queue_position": 3}, NOW)["queue_position"]
        == 3
    )
    assert [format_duration(s) for s in (None, 9, 125, 7322)] == ["—", "9s", "2m 5s", "2h 2m"]


def test_the_steps_show_every_failed_attempt_and_reconciliation_with_its_evidence():
    html = templates.get_template("job_parts.html").render(
        job=JOB,
        buttons=[],
        rerun_from=None,
        caller="arn:x",
        level="manage",
        summary=job_summary(JOB, None, NOW),
    )
    assert (
        "attempt 1 failed 2026-12-01 11:59:50 UTC on mac-2: its command exited 75, a code the project marks "
        "transient "
        "(Relevo.Transient.ExitCode)"
    ) in _timeless(html)
    assert (
        "reconciled attempt 2 on mac-1 2026-12-01 11:59:59 UTC: rerun; evidence: probe_exit=1"
        in _timeless(html)
    )
    assert "2 files, 1.5 KiB uploaded" in html and "1 retry" in html
    assert "api (api) by arn:aws:iam::123456789012:user/ana" in html


def _timeless(html: str) -> str:
    """The page with each relative time (which depends on when the test runs) as its exact one, the title."""
    return re.sub(r'<time datetime="[^"]*" title="([^"]*)">[^<]*</time>', r"\1", html)


def _transfer(attempt: int, state: str, files_done: int, bytes_done: int, current: str | None = None) -> dict:
    return {
        "attempt": attempt,
        "state": state,
        "files_done": files_done,
        "files_total": 5,
        "bytes_done": bytes_done,
        "bytes_total": 1200 * MIB,
        "current_file": current,
        "updated_at": "2026-12-01T12:00:20+00:00",
    }


MIB = 1024 * 1024


def test_each_attempts_transfer_is_in_the_steps_live_then_its_totals():
    """Issue 18, Steps: per attempt, the upload as the agent last reported it. The attempt shown is
    in its stage's row, an earlier one in its attempt row."""
    uploading = _transfer(2, "uploading", 2, 412 * MIB, "App.ipa")
    failed = _transfer(1, "failed", 1, 100 * MIB)
    build = {**JOB["stages"][0], "status": "running", "transfer": uploading, "transfers": [failed, uploading]}
    job = {**JOB, "stages": [build, JOB["stages"][1]], "artifacts": []}
    html = templates.get_template("job_parts.html").render(
        job=job,
        buttons=[],
        rerun_from=None,
        caller="arn:x",
        level="manage",
        summary=job_summary(job, None, NOW),
    )
    assert '<td class="transfer">uploading 3 of 5 files, 412.0 MiB of 1.2 GiB (34 %)</td>' in html
    assert (
        "attempt 1 failed 2026-12-01 11:59:50 UTC on mac-2: its command exited 75, a code the project marks "
        "transient (Relevo.Transient.ExitCode); "
        '<span class="transfer">upload failed after 1 of 5 files, 100.0 MiB of 1.2 GiB (8 %)</span>'
        in _timeless(html)
    )
    done = {**build, "status": "succeeded", "transfer": _transfer(2, "uploaded", 5, 1200 * MIB)}
    assert job_summary({**job, "stages": [done]}, None, NOW)["transfers"] == {
        "build": "5 files, 1.2 GiB uploaded"
    }


def test_an_artifact_removed_by_the_projects_quota_is_shown_removed_with_no_download_link():
    """artifact.max_total_bytes keeps a removed artifact's record (removed_at): its row says so, and
    neither it nor its directory is offered for download (the API answers 410 ARTIFACT_REMOVED)."""
    from relevo_cli.console.archive import artifact_directories

    removed = {
        "stage": "build",
        "name": "dir/old.ipa",
        "size": 9,
        "sha256": "2" * 64,
        "removed_at": "2026-12-01T12:30:00+00:00",
        "removed_reason": "artifact.max_total_bytes",
    }
    job = {**JOB, "artifacts": [*JOB["artifacts"], removed]}
    directories = artifact_directories(job["artifacts"])
    html = templates.get_template("job_parts.html").render(
        job=job,
        buttons=[],
        rerun_from=None,
        caller="arn:x",
        level="manage",
        summary=job_summary(job, None, NOW),
        directories=directories,
    )
    assert "removed by quota 2026-12-01 12:30:00 UTC (artifact.max_total_bytes)" in _timeless(html)
    assert "/artifacts/dir/old.ipa" not in html and 'title="Download a.bin"' in html
    assert directories == [{"stage": "build", "shard": None, "name": "dir", "files": 1, "size": 2}]
    # Each row's type: a directory (downloaded as one .tar.gz), or a file and what its name says it is
    assert '<td>dir/ (1 file)</td><td>build</td><td class="type">directory (.tar.gz)</td>' in html
    for name, kind in (
        ("a.bin", "file, application/octet-stream"),
        ("dir/b.txt", "file, text/plain"),
        ("dir/old.ipa", "file, .ipa"),
    ):
        assert f'<td>{name}</td><td>build</td><td class="type">{kind}</td>' in html
    assert [artifact_type(name) for name in ("App.app/Contents/MacOS/App", "logs.tar.gz")] == [
        "file",
        "file, application/x-tar (gzip)",
    ]


def test_each_shards_artifacts_and_directories_are_rows_of_their_own_linked_by_shard():
    """Two shards of test leaving one name: a row each, naming the shard, each link asking for its
    shard (the name alone is ambiguous); their directories are two, one a shard."""
    from relevo_cli.console.archive import artifact_directories

    shards = [
        {"stage": "test", "shard": k, "name": name, "size": 3 + k, "sha256": str(k) * 64}
        for k in (0, 1)
        for name in ("app.ipa", "logs/run.txt")
    ]
    job = {**JOB, "artifacts": shards}
    directories = artifact_directories(job["artifacts"])
    html = templates.get_template("job_parts.html").render(
        job=job,
        buttons=[],
        rerun_from=None,
        caller="arn:x",
        level="manage",
        summary=job_summary(job, None, NOW),
        directories=directories,
    )
    assert directories == [
        {"stage": "test", "shard": k, "name": "logs", "files": 1, "size": 3 + k} for k in (0, 1)
    ]
    for k in (0, 1):
        assert f"<td>app.ipa</td><td>test#shard-{k}</td>" in html
        assert f'href="/jobs/j-1/artifacts/app.ipa?stage=test&amp;shard={k}"' in html
        assert f"<td>logs/ (1 file)</td><td>test#shard-{k}</td>" in html
        assert f'href="/jobs/j-1/directories/logs.tar.gz?stage=test&amp;shard={k}"' in html


def test_the_job_page_shows_what_each_stage_handed_on_restored_and_wrote():
    handed = {
        "files": 1834,
        "dirs": 211,
        "symlinks": 12,
        "bytes": 3 * MIB,
        "uploaded_bytes": 3 * MIB,
        "digest": "9f2c" + "0" * 60,
        "manifest": "s3://b/p/j/.relevo-handoff/manifests/build.1.json",
        "stored_at": "2026-12-01T12:00:12+00:00",
        "attempt": 1,
    }
    restored = {
        "restored": {
            "from_stages": ["build"],
            "files": 1834,
            "restored_bytes": 3 * MIB,
            "cached_bytes": 0,
            "present_bytes": 0,
        },
        "restored_bytes": 3 * MIB,
        "restored_files": 1834,
        "restored_digest": "9f2c" + "0" * 60,
    }
    job = {
        **JOB,
        "stages": [
            {**JOB["stages"][0], "handoff": handed, "outputs": {"version": "1.4.2", "notes": "<b>first</b>"}},
            {**JOB["stages"][1], "handoff": restored, "outputs": {}},
        ],
    }
    html = templates.get_template("job_parts.html").render(
        job=job,
        buttons=[],
        rerun_from=None,
        caller="arn:x",
        level="manage",
        summary=job_summary(job, None, NOW),
    )
    assert "<h2>Handoff</h2>" in html
    assert "1834 files, 211 dirs, 12 symlinks, 3.0 MiB (3.0 MiB stored)" in html
    assert "1834 files from build: 3.0 MiB downloaded" in html
    assert '<code>version</code> = <span title="1.4.2">1.4.2</span>' in html
    assert "&lt;b&gt;first&lt;/b&gt;" in html and "<b>first</b>" not in html  # values are escaped
    # A job of stages that hand nothing on shows no such section.
    plain = templates.get_template("job_parts.html").render(
        job=JOB,
        buttons=[],
        rerun_from=None,
        caller="arn:x",
        level="manage",
        summary=job_summary(JOB, None, NOW),
    )
    assert "<h2>Handoff</h2>" not in plain


def test_a_job_queued_behind_a_gate_names_the_job_its_stage_and_since_when():
    # Given a queued job whose project's lock holder waits for approval before upload (the job view says so)
    behind = {"job_id": "j-0", "stage": "upload", "since": "2026-12-01T11:00:00Z"}
    job = {
        **JOB,
        "status": "queued",
        "current_stage": None,
        "stages": [_stage("build", 0), _stage("upload", 1)],
        "artifacts": [],
        "queue_reason": "project_waiting_for_approval",
        "waiting_behind": behind,
        "queue_detail": "job j-0 of its project waits for approval before upload since "
        "2026-12-01T11:00:00Z: this one starts "
        "when that one ends, and its queue_timeout_sec does not run meanwhile",
    }

    # When the job page is rendered
    html = templates.get_template("job_parts.html").render(
        job=job,
        buttons=[],
        rerun_from=None,
        caller="arn:x",
        level="manage",
        summary=job_summary(job, None, NOW),
    )

    # Then its Waiting row says why, in words, and links the job it waits behind
    plain = _timeless(html)
    assert 'title="project_waiting_for_approval"' in html
    assert "job j-0 of its project waits for approval before upload since 2026-12-01T11:00:00Z" in plain
    assert '<a href="/jobs/j-0">j-0</a>, waiting 2026-12-01 11:00:00 UTC' in plain
    assert "another job of its project is running" not in plain
