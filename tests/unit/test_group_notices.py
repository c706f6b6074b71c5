"""What a group is told for each job transition, and the Slack message within Block Kit's limits."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from relevo_core.models.group import DEFAULT_EVENTS, Group, GroupEvent
from relevo_core.notify.groups import job_notices
from relevo_core.notify.messages import Notice, email_message, slack_message
from relevo_core.notify.transitions import job_transition
from tests.helpers.block_kit import check_message


def _job(status, **extra):
    return {
        "pk": "JOB#j",
        "sk": "JOB",
        "job_id": "job_0000000000000000000000a",
        "project": "ios-app",
        "status": status,
        "updated_at": extra.pop("updated_at", "t1"),
        "envelope": {
            "ref": "refs/tags/v1.4",
            "commit": "a" * 40,
            "trigger": {"type": "webhook", "source": "github", "actor": "ana"},
        },
        **extra,
    }


def _notices(old, new):
    return [
        (n.event.value, n.title, key) for n, key in job_notices(job_transition(old, new), "https://x/jobs/j")
    ]


WAITING = _job("waiting", waiting_stage="deploy")


def test_a_gate_is_one_job_waiting_an_approval_adds_nothing_a_reject_or_timeout_ends_it_not_failed():
    assert _notices(_job("running"), WAITING) == [
        ("job_waiting", "ios-app: deploy waits for approval", "job_waiting#deploy")
    ]
    assert _notices(WAITING, _job("running", updated_at="t2")) == []
    rejected = _job(
        "failed",
        error_name="Relevo.Approval.Rejected",
        error_cause='{"reason": "crash in QA"}',
        waiting_stage="deploy",
    )
    assert _notices(WAITING, rejected) == [
        ("job_waiting", "ios-app: deploy rejected", "job_waiting#deploy#outcome")
    ]
    timed_out = _job("failed", error_name="Relevo.Approval.Timeout", waiting_stage="deploy")
    assert _notices(WAITING, timed_out) == [
        ("job_waiting", "ios-app: deploy timed out waiting for approval", "job_waiting#deploy#outcome")
    ]
    [(notice, _)] = job_notices(job_transition(WAITING, rejected), "l")
    assert notice.reason == "crash in QA"


def test_failures_and_successes_are_told_once_per_job():
    assert _notices(
        _job("running"), _job("failed", error_name="Relevo.Fatal.ExitCode", last_successful_stage="build")
    ) == [("job_failed", "ios-app: job failed", "ended")]
    assert _notices(_job("running"), _job("succeeded")) == [
        ("job_succeeded", "ios-app: job succeeded", "ended")
    ]
    assert _notices(None, _job("queued")) == [] and _notices(_job("queued"), _job("running")) == []


def test_job_succeeded_is_opt_in():
    group = Group.model_validate(
        {"name": "ios", "channels": [{"kind": "email", "addresses": ["rm@example.com"]}]}
    )
    assert group.events == DEFAULT_EVENTS and GroupEvent.JOB_SUCCEEDED not in group.events
    with pytest.raises(ValidationError):
        Group.model_validate(
            {
                "name": "ios",
                "channels": [{"kind": "slack", "webhook_secret_ref": "https://hooks.slack.com/x"}],
            }
        )


def test_the_waiting_message_carries_what_a_release_manager_acts_on():
    [(notice, _)] = job_notices(
        job_transition(_job("running"), WAITING), "https://console/jobs/job_0000000000000000000000a"
    )
    message = slack_message(notice)
    assert check_message(message) == []
    text = str(message)
    for shown in (
        "ios-app",
        "refs/tags/v1.4",
        "deploy",
        "ana",
        "`relevo job approve job_0000000000000000000000a`",
        "https://console/jobs/",
    ):
        assert shown in text


def test_long_values_are_cut_to_the_limits_and_the_check_catches_what_is_not():
    huge = Notice(
        GroupEvent.JOB_FAILED,
        "t" * 400,
        project="p",
        reason="r" * 10_000,
        link="https://x/" + "y" * 100,
        command="c" * 4000,
    )
    assert check_message(slack_message(huge)) == []
    broken = {"text": "x", "blocks": [{"type": "header", "text": {"type": "mrkdwn", "text": "h" * 151}}] * 51}
    problems = check_message(broken)
    assert "51 blocks (at most 50)" in problems and any("must be plain_text" in p for p in problems)
    subject, _ = email_message(huge)
    assert len(subject) <= 100 and "\n" not in subject


def test_a_project_file_carries_its_group_and_commit_status_to_the_api(tmp_path):
    from relevo_cli.projects import load_project_file

    path = tmp_path / "ios-app.yaml"
    path.write_text(
        "id: ios-app\nrepo: acme/ios-app\nregion_affinity: eu-west\ngroup: ios\nstages:\n  - name: build\n  "
        "  run: make\n"
        "commit_status:\n  provider: gitlab\n  token_ref: relevo/relevo/_status/ios-app\nconsole_url: https://relevo.example.com\n"
    )
    loaded = load_project_file(path)
    assert (loaded.project.group, loaded.project.commit_status.provider, loaded.project.console_url) == (
        "ios",
        "gitlab",
        "https://relevo.example.com",
    )
    assert loaded.document["group"] == "ios"  # what `relevo project apply` sends


def test_the_demo_shows_the_recorded_slack_message_as_the_channel_would():
    from relevo_tools.demo_release import slack_text

    [(notice, _)] = job_notices(
        job_transition(_job("running"), WAITING), "https://console/jobs/job_0000000000000000000000a"
    )
    shown = slack_text(slack_message(notice))
    assert shown[0] == "# ios-app: deploy waits for approval"
    assert "Project: ios-app" in shown[1] and "Stage: deploy" in shown[1] and "Actor: ana" in shown[1]
    assert "`relevo job approve job_0000000000000000000000a`" in shown
    assert shown[-1] == "[Open the job] https://console/jobs/job_0000000000000000000000a"


def _region(online):
    return {
        "pk": "AGENTS#eu-west",
        "sk": "ONLINE_AGENTS",
        "online": online,
        "online_agents": int(online),
        "changed_at": 1.0,
    }


def _agent(online):
    return {"pk": "AGENTS#eu-west", "sk": "AGENT#mac-1", "agent_id": "mac-1", "online": online}


@pytest.mark.parametrize(
    "old, new, paged",
    [
        (_region(True), _region(False), True),  # the sweeper saw the region's last agent lost
        (None, _region(False), False),  # the region's first record, with no agent yet: nothing was lost
        (_region(False), _region(True), False),  # back online
        (_agent(True), _agent(False), True),  # a clean stop
        (_agent(False), _agent(False), False),
    ],
)
def test_agents_offline_is_heard_from_a_clean_stop_and_from_the_sweepers_record_of_the_region(
    monkeypatch, old, new, paged
):
    from relevo_core.notify import groups

    heard = []
    monkeypatch.setattr(
        groups,
        "notify_agents_offline",
        lambda _reporter, region, reason, agent_id, *_: heard.append((region, agent_id, reason)),
    )
    groups.notify_other_change(None, old, new, 0.0, projects=list)
    assert bool(heard) is paged
    if paged:
        [(region, agent_id, reason)] = heard
        assert region == "eu-west" and agent_id == new.get("agent_id")
        assert ("stopped" in reason) is (agent_id is not None)
