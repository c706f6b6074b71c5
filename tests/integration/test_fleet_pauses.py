"""The fleet's pause routes through the local API Gateway (issue 20): only the stack's admin
principals may pause, drain or resume an agent or a region's dispatch (an agent belongs to no
project: no project grant covers it); bad input is refused with a stable code and writes nothing;
a pause is stored with its wall-clock `until`, shows in the queue view, in `relevo agents`, in the
console's fleet page and as the job's queue reason `agent_paused`, and resume removes it."""

from __future__ import annotations

import json
import secrets
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from relevo_cli.api import RelevoApi
from relevo_cli.commands.common import console
from relevo_cli.console.render import templates
from relevo_cli.main import app
from relevo_cli.words import exact_time
from relevo_core.aws import client
from relevo_core.store import agents
from relevo_core.store.agents import AgentPresence
from tests.helpers import TEST_ADMIN_ARN
from tests.helpers.agents import handle_received
from tests.helpers.iam import iam_user
from tests.helpers.stack import (
    job_execution_arn,
    job_items,
    receive_stage,
    register_project,
    table_items,
    wait_until,
)

REGION = "eu-west"


@pytest.fixture(autouse=True)
def wide_console(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(console, "width", 250)


def _presence(local_stack, agent_id: str, now: datetime) -> None:
    agents.put_presence(
        local_stack.table_name,
        AgentPresence(
            agent_id=agent_id,
            region=REGION,
            capacity=1,
            running=0,
            version="test",
            last_seen=now,
            interval_sec=30,
        ),
    )


def _pause_items(local_stack) -> list[dict]:
    return [i for i in table_items(local_stack, f"PAUSES#{REGION}") if i["sk"]["S"].startswith("PAUSE")]


def test_only_admins_pause_and_bad_input_writes_nothing(local_stack):
    agent_id = f"mac-{secrets.token_hex(3)}"
    _presence(local_stack, agent_id, datetime.now(UTC))
    stranger = iam_user(local_stack, f"fleet-stranger-{secrets.token_hex(2)}")
    admin = iam_user(local_stack, TEST_ADMIN_ARN.rsplit("/", 1)[1])
    before = _pause_items(local_stack)
    for path, body in [
        (f"/agents/{agent_id}/pause", {"note": "x"}),
        (f"/agents/{agent_id}/resume", None),
        (f"/regions/{REGION}/pause", {}),
        (f"/regions/{REGION}/resume", None),
    ]:
        status, answer = stranger.call("POST", path, body)
        assert (status, answer["error"]) == (403, "FORBIDDEN"), (path, answer)
        assert "AdminPrincipals" in answer["message"]
    # The stack's own IAM user manages the projects it created; that is no fleet permission either.
    owner = RelevoApi.for_stack(local_stack)
    with pytest.raises(Exception, match="FORBIDDEN"):
        owner.request("POST", f"/agents/{agent_id}/pause", {})
    for path, body, expected in [
        (f"/agents/{agent_id}/pause", {"timeout_sec": 7 * 24 * 3600 + 1}, (422, "VALIDATION_FAILED")),
        (f"/agents/{agent_id}/pause", {"timeout_sec": 0}, (422, "VALIDATION_FAILED")),
        (f"/agents/{agent_id}/pause", {"until": "tomorrow"}, (422, "VALIDATION_FAILED")),
        (f"/agents/{agent_id}/pause", {"region": "nowhere"}, (422, "REGION_UNKNOWN")),
        ("/agents/never-started/pause", {}, (404, "AGENT_NOT_FOUND")),
        ("/regions/nowhere/pause", {}, (422, "REGION_UNKNOWN")),
        (f"/regions/{REGION}/pause", {"drain": True}, (422, "VALIDATION_FAILED")),
    ]:
        status, answer = admin.call("POST", path, body)
        assert (status, answer["error"]) == expected, (path, body, answer)
    assert _pause_items(local_stack) == before


def test_a_pause_shows_everywhere_until_resumed(local_stack, project_id, tmp_path: Path):
    admin = iam_user(local_stack, TEST_ADMIN_ARN.rsplit("/", 1)[1])
    # Only this agent online in the region for the test: older records of other tests go stale.
    now = datetime.now(UTC)
    online = agents.online_agents(local_stack.table_name, REGION, now)
    agent_id = f"mac-{secrets.token_hex(3)}"
    _presence(local_stack, agent_id, now)

    status, answer = admin.call(
        "POST", f"/agents/{agent_id}/pause", {"note": "Xcode update", "timeout_sec": 7200}
    )
    assert status == 200, answer
    pause = answer["paused"]
    assert (pause["region"], pause["agent_id"], pause["note"], pause["drain"], pause["timeout_sec"]) == (
        REGION,
        agent_id,
        "Xcode update",
        False,
        7200,
    )
    assert datetime.fromisoformat(pause["until"]) - datetime.fromisoformat(pause["set_at"]) == timedelta(
        hours=2
    )
    assert pause["set_by"] == TEST_ADMIN_ARN

    [row] = [a for a in admin.api.queue()["agents"] if a["agent_id"] == agent_id]
    assert row["paused"]["note"] == "Xcode update"
    stack_file = tmp_path / "stack.json"
    stack_file.write_text(json.dumps(local_stack.model_dump()))
    shown = CliRunner().invoke(app, ["agents", "--stack-file", str(stack_file)])
    assert shown.exit_code == 0 and f"paused until {pause['until'][:19]}: Xcode update" in shown.output, (
        shown.output
    )
    page = templates.get_template("fleet.html").render(regions=[(REGION, [row])], fleet_manage=True)
    assert f"paused until {exact_time(pause['until'])}: Xcode update" in page

    if not online:  # the job view's reason is the region's: only when no other agent is online
        register_project(local_stack, project_id, [{"name": "build", "run": "make"}], queue_timeout_sec=600)
        job_id = RelevoApi.for_stack(local_stack).run_project(project_id, {"ref": "main"})["job_id"]
        try:
            wait_until(
                lambda: admin.api.get_job(job_id)["queue_reason"] == "agent_paused", 30, "agent_paused"
            )
        finally:
            RelevoApi.for_stack(local_stack).cancel_job(job_id)
            _, receipt = receive_stage(local_stack, job_id)  # no agent of a later test may find it
            client("sqs").delete_message(QueueUrl=local_stack.work_queues[REGION], ReceiptHandle=receipt)

    status, answer = admin.call("POST", f"/agents/{agent_id}/resume", None)
    assert status == 200 and answer["resumed"] is True and answer["ended"]["note"] == "Xcode update", answer
    [row] = [a for a in admin.api.queue()["agents"] if a["agent_id"] == agent_id]
    assert row["paused"] is None
    assert admin.call("POST", f"/agents/{agent_id}/resume", None)[1]["resumed"] is False


def test_a_regions_dispatch_pause(local_stack):
    admin = iam_user(local_stack, TEST_ADMIN_ARN.rsplit("/", 1)[1])
    status, answer = admin.call(
        "POST", f"/regions/{REGION}/pause", {"note": "network maintenance", "timeout_sec": 60}
    )
    assert status == 200 and answer["paused"]["agent_id"] is None, answer
    try:
        assert [(p["region"], p["note"]) for p in admin.api.queue()["paused_regions"]] == [
            (REGION, "network maintenance")
        ]
    finally:
        assert admin.call("POST", f"/regions/{REGION}/resume", None)[1]["resumed"] is True
    assert admin.api.queue()["paused_regions"] == []


def _job_messages(local_stack, job_id: str) -> list[dict]:
    """Every message of the job on the region's queue (the bodies, each with its receipt handle)."""
    sqs, found = client("sqs"), []
    for _ in range(10):
        answer = sqs.receive_message(
            QueueUrl=local_stack.work_queues[REGION], WaitTimeSeconds=1, MaxNumberOfMessages=10
        )
        for message in answer.get("Messages", []):
            body = json.loads(message["Body"])
            if body["job_id"] == job_id:
                found.append({**body, "receipt_handle": message["ReceiptHandle"]})
            else:  # an earlier test's job nobody runs: visible again for its own test at once
                sqs.change_message_visibility(
                    QueueUrl=local_stack.work_queues[REGION],
                    ReceiptHandle=message["ReceiptHandle"],
                    VisibilityTimeout=0,
                )
        if len(found) >= 2:
            break
    return found


def test_a_queue_wait_that_runs_out_while_the_region_is_paused_is_renewed_and_the_job_runs_after_resume(
    local_stack, project_id, tmp_path: Path
):
    """Issue 20: a job never fails because of a pause. With the region's dispatch paused, no agent
    claims the stage, and its queue_timeout_sec (5 s) runs out: the state machine finds the pause
    in force and sends the same attempt again with a longer wait, where it used to fail the job
    with Relevo.Timeout.Queue. After the resume, an agent that gets the first message (its token no
    longer waits) lets its claim go at once, and the stage runs from the second one."""
    from relevo_agent.config import AgentConfig
    from relevo_agent.journal import Journal
    from relevo_agent.messages import Message
    from relevo_agent.service import Agent
    from tests.helpers.stack import wait_for_execution
    from tests.helpers.state_machine import start_job

    admin = iam_user(local_stack, TEST_ADMIN_ARN.rsplit("/", 1)[1])
    status, answer = admin.call(
        "POST", f"/regions/{REGION}/pause", {"note": "held queue wait", "timeout_sec": 300}
    )
    assert status == 200, answer
    try:
        job_id = start_job(
            local_stack, project_id, stages=[{"name": "upload", "run": "true"}], queue_timeout_sec=5
        )
        stage = wait_until(
            lambda: (s := _stage_record(local_stack, job_id)).get("pause_holds") and s,
            30,
            "the queue wait renewed",
        )
        assert (stage["status"], stage["pause_holds"]) == ("dispatched", 1)
        assert RelevoApi.for_stack(local_stack).get_job(job_id)["status"] not in ("failed", "canceled")
        assert (
            client("stepfunctions").describe_execution(executionArn=job_execution_arn(local_stack, job_id))[
                "status"
            ]
            == "RUNNING"
        )
    finally:
        assert admin.call("POST", f"/regions/{REGION}/resume", None)[1]["resumed"] is True

    first, second = _job_messages(local_stack, job_id)
    assert (first["attempt"], second["attempt"]) == (1, 1) and first["task_token"] != second["task_token"]
    config = AgentConfig(
        agent_id="mac-held",
        region=REGION,
        workspace_root=tmp_path,
        journal=tmp_path / "j.sqlite3",
        max_clock_skew_sec=0.5,
    )
    agent = Agent(
        config,
        local_stack.table_name,
        local_stack.work_queues[REGION],
        Journal(config.journal),
        api_url=local_stack.api_url,
    )
    stale, live = sorted(
        (first, second), key=lambda m: _dispatched_order(local_stack, job_id, m["task_token"])
    )
    for message in (stale, live):
        handle_received(
            agent,
            Message(
                agent.queue_url,
                {
                    "Body": json.dumps({k: v for k, v in message.items() if k != "receipt_handle"}),
                    "ReceiptHandle": message["receipt_handle"],
                    "MessageId": "m",
                },
            ),
        )
        if message is stale:
            # Let go at once: the next claim of attempt 1 is not held off by this one's lease.
            record = _stage_record(local_stack, job_id)
            assert record["agent_id"] == "mac-held" and int(record["lease_expires_at"]) < int(
                datetime.now(UTC).timestamp()
            )

    assert wait_for_execution(local_stack, job_id, timeout=60)["status"] == "SUCCEEDED"
    done = RelevoApi.for_stack(local_stack).get_job(job_id)
    assert done["status"] == "succeeded" and done["stages"][0]["attempt"] == 1


def _stage_record(local_stack, job_id: str) -> dict:
    from relevo_core.store.codec import from_attributes

    return {i["sk"]["S"]: from_attributes(i) for i in job_items(local_stack, job_id)}.get("STAGE#00", {})


def _dispatched_order(local_stack, job_id: str, token: str) -> int:
    """Which dispatch of the execution sent this token (0: the first)."""
    from tests.helpers.stack import history

    sent = [
        e["taskScheduledEventDetails"]["parameters"]
        for e in history(local_stack, job_id)
        if e["type"] == "TaskScheduled"
        and e["taskScheduledEventDetails"]["resource"] == "sendMessage.waitForTaskToken"
    ]
    return next(i for i, parameters in enumerate(sent) if token in parameters)


def test_a_fresh_agent_takes_nothing_before_it_has_read_its_pauses(
    local_stack, project_id, tmp_path: Path, monkeypatch
):
    """launchd restarts a drained or paused agent; the new instance's poll must not receive a
    stage before its first read of the pauses. The read is slowed here so that the poll, which
    used to start receiving at once, would claim the waiting stage first."""
    import threading
    import time

    from relevo_agent import presence as presence_module
    from relevo_agent.config import AgentConfig
    from relevo_agent.journal import Journal
    from relevo_agent.service import Agent
    from relevo_core.store import agent_pauses
    from tests.helpers.state_machine import start_job

    admin = iam_user(local_stack, TEST_ADMIN_ARN.rsplit("/", 1)[1])
    assert (
        admin.call("POST", f"/regions/{REGION}/pause", {"note": "fresh agent", "timeout_sec": 120})[0] == 200
    )
    real_read = agent_pauses.pauses_for_agent

    def slow_read(*args, **kwargs):
        time.sleep(1.5)
        return real_read(*args, **kwargs)

    monkeypatch.setattr(presence_module.agent_pauses, "pauses_for_agent", slow_read)
    config = AgentConfig(
        agent_id=f"mac-fresh-{secrets.token_hex(2)}",
        region=REGION,
        workspace_root=tmp_path,
        journal=tmp_path / "j.sqlite3",
    )
    agent = Agent(
        config,
        local_stack.table_name,
        local_stack.work_queues[REGION],
        Journal(config.journal),
        api_url=local_stack.api_url,
    )
    try:
        job_id = start_job(
            local_stack, project_id, stages=[{"name": "upload", "run": "true"}], queue_timeout_sec=120
        )
        wait_until(
            lambda: _stage_record(local_stack, job_id).get("status") == "dispatched",
            30,
            "the stage dispatched",
        )
        poller = threading.Thread(target=agent._poll, daemon=True)
        poller.start()
        time.sleep(4)
        assert "agent_id" not in _stage_record(local_stack, job_id), (
            "claimed while its region's dispatch was paused"
        )
    finally:
        agent.stop.gracefully()
        agent.presence.stop()
        admin.call("POST", f"/regions/{REGION}/resume", None)
    client("stepfunctions").stop_execution(executionArn=job_execution_arn(local_stack, job_id))


def test_the_console_fleet_page_shows_each_regions_dispatch_pause_with_its_note_and_until():
    """GET /queue's `paused_regions` (each pause as the API dumps it) on the console's fleet page: a
    region's dispatch pause with its note, until and who set it, the region shown even when none
    of its agents has reported."""
    from relevo_cli.console.views.fleet import fleet_context
    from relevo_core.store.agent_pauses import AgentPause

    set_at = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
    noted = AgentPause(
        region=REGION,
        note="network maintenance",
        set_at=set_at,
        until=set_at + timedelta(hours=2),
        timeout_sec=7200,
        set_by=TEST_ADMIN_ARN,
    )
    bare = AgentPause(region="us-east", set_at=set_at, until=set_at + timedelta(minutes=30), timeout_sec=1800)
    agent = {
        "agent_id": "mac-1",
        "region": REGION,
        "online": True,
        "paused": None,
        "not_claiming": None,
        "last_seen": "2026-12-01T09:00:05+00:00",
        "used": 0,
        "capacity": 1,
        "running_stages": [],
        "version": "test",
    }
    view = {
        "agents": [agent],
        "paused_regions": [noted.model_dump(mode="json"), bare.model_dump(mode="json")],
        "regions": [REGION, "us-east", "ap-south"],
        "fleet_manage": True,
    }
    page = templates.get_template("fleet.html").render(**fleet_context(view, TEST_ADMIN_ARN))
    assert (
        f"Dispatch paused until 2026-12-01 11:00:00 UTC: network maintenance (set by {TEST_ADMIN_ARN})</p>"
        in page
    )
    assert (
        "<h2>us-east: 0 of 0 online</h2>" in page
        and "Dispatch paused until 2026-12-01 09:30:00 UTC</p>" in page
    )
    # A region of the stack no agent reported from is listed too, with how to start one
    assert "<h2>ap-south: 0 of 0 online</h2>" in page
    assert (
        "No agent of this region has reported (a local one: <code>relevo local agent --region "
        "us-east</code>)." in page
    )
    assert "Dispatch paused" not in templates.get_template("fleet.html").render(
        **fleet_context({**view, "paused_regions": []}, TEST_ADMIN_ARN)
    )
