"""What the CLI and the console say of a job in words: its failure as a sentence, times relative to
now with their exact value, which Mac ran which stages."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from relevo_cli.words import error_sentence, exact_time, macs_by_stage, time_ago

NOW = datetime(2026, 12, 2, 12, 30, 0, tzinfo=UTC)


def _failed(error: str, cause: object, stage: str = "notarize", attempts: int = 1) -> dict:
    detail = {
        "stage": stage,
        "stage_index": 1,
        "error_class": error,
        "cause": cause if isinstance(cause, str) else json.dumps(cause),
        "attempts": attempts,
        "retry_count": attempts - 1,
        "cumulative_backoff_sec": 0,
    }
    return {
        "error": error,
        "error_cause": json.dumps(detail),
        "stages": [{"name": stage, "agent_id": "mac-us-1"}],
    }


def test_a_failure_is_a_sentence_naming_the_stage_the_mac_what_happened_and_the_class():
    assert error_sentence(
        _failed("Relevo.Fatal.ExitCode", {"exit_code": 1, "agent_id": "mac-us-1", "attempt": 1})
    ) == ("notarize failed on mac-us-1: its command exited 1 (Relevo.Fatal.ExitCode, 1 attempt).")
    assert error_sentence(
        _failed("Relevo.Transient.ExitCode", {"exit_code": 75, "agent_id": "mac-us-2"}, attempts=3)
    ) == (
        "notarize failed on mac-us-2: its command exited 75, a code the project marks transient "
        "(Relevo.Transient.ExitCode, 3 attempts)."
    )
    # No cause reported (a queue timeout): the stage's Mac, if any, and what the class means
    assert error_sentence(_failed("Relevo.Timeout.Queue", "no cause was reported")) == (
        "notarize failed on mac-us-1: no agent claimed it within its queue_timeout_sec "
        "(Relevo.Timeout.Queue, 1 attempt)."
    )
    assert error_sentence(
        _failed("Relevo.Fatal.Output", {"exit_code": 0, "agent_id": "mac-1", "why": "line 2: not key=value"})
    ).endswith("(Relevo.Fatal.Output, 1 attempt). line 2: not key=value")
    assert error_sentence({"error": None}) is None


def test_a_job_that_gave_up_waiting_for_its_project_blames_the_project_not_the_agents():
    # Given a job that waited out its queue timeout behind another job of its project (job.asl.json's
    # GiveUpWaiting)
    job = {
        "error": "Relevo.Timeout.Queue",
        "error_cause": "the project stayed busy for the whole queue_timeout_sec",
        "stages": [],
    }

    # When it is said in words, then the project's other job is named as the cause, not the agents
    assert error_sentence(job) == (
        "The job failed: another job of its project held the project for its whole queue_timeout_sec, so it "
        "never started "
        "(Relevo.Timeout.Queue)."
    )


def test_times_are_relative_with_the_exact_one_beside_them():
    assert exact_time("2026-12-02T12:25:37.149180+00:00") == "2026-12-02 12:25:37 UTC"
    assert [
        time_ago(t, NOW)
        for t in (
            "2026-12-02T12:29:58+00:00",
            "2026-12-02T12:29:00+00:00",
            "2026-12-02T12:25:37.149180+00:00",
            "2026-12-02T09:30:00+00:00",
            "2026-11-30T12:00:00+00:00",
            "2026-11-01T00:00:00+00:00",
        )
    ] == ["just now", "1 min ago", "4 min ago", "3 h ago", "2 days ago", "2026-11-01"]


def test_macs_name_the_stages_each_ran():
    job = {
        "stages": [
            {"name": "build", "agent_id": "mac-eu-1"},
            {"name": "sign", "agent_id": "mac-eu-2"},
            {"name": "upload", "agent_id": "mac-eu-2"},
            {"name": "deploy", "agent_id": None},
        ]
    }
    assert macs_by_stage(job) == [("mac-eu-1", ["build"]), ("mac-eu-2", ["sign", "upload"])]
