"""Group channels on the local stack: a gated job's Slack messages and emails (the group topic,
through an SQS subscription filtered like an address's), exactly one job_waiting per gate
whatever its outcome, and agents_offline only on change (an in-process reporter with an injected
clock, against the stack's table)."""

from __future__ import annotations

import json
import secrets
import time
from datetime import UTC, datetime

import pytest

from relevo_cli.api import RelevoApi
from relevo_core.aws import client
from relevo_core.config.notify import NotifySettings
from relevo_core.models.group import Group, GroupEvent
from relevo_core.notify.reporter import Reporter
from relevo_core.notify.sending import Clock, Urllib3Transport
from relevo_core.store import agents
from relevo_core.store.codec import from_attributes
from relevo_core.store.deliveries import project_deliveries
from relevo_core.store.groups import find_group, put_group
from relevo_core.store.projects import get_project, list_projects
from tests.helpers.block_kit import check_message
from tests.helpers.stack import (
    job_record,
    receive_stage,
    register_project,
    table_items,
    wait_for_execution,
    wait_until,
)
from tests.helpers.state_machine import agent_runs

GATED = [{"name": "build", "run": "make"}, {"name": "deploy", "run": "fastlane deliver"}]


@pytest.fixture()
def group(local_stack, recorder):
    """A group with a Slack channel (webhook URL to the recorder, in Secrets Manager) and an email
    channel; its email is read from an SQS queue subscribed to the group topic with the filter
    policy `relevo group apply` gives each address."""
    name = "g-" + secrets.token_hex(4)
    hook_path = f"/services/T0/B0/{secrets.token_hex(12)}"
    ref = f"relevo/{local_stack.stack_name}/_notify/{name}/slack"
    client("secretsmanager").create_secret(Name=ref, SecretString=recorder.url + hook_path)
    put_group(
        local_stack.table_name,
        Group.model_validate(
            {
                "name": name,
                "events": ["job_waiting", "job_failed", "job_succeeded", "agents_offline"],
                "channels": [
                    {"kind": "slack", "webhook_secret_ref": ref},
                    {"kind": "email", "addresses": ["rm@example.com"]},
                ],
            }
        ),
        "test",
        datetime.now(UTC),
    )
    sqs = client("sqs")
    queue_url = sqs.create_queue(QueueName=f"mail-{name}")["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    client("sns").subscribe(
        TopicArn=local_stack.resources["GroupTopic"],
        Protocol="sqs",
        Endpoint=queue_arn,
        Attributes={"RawMessageDelivery": "true", "FilterPolicy": json.dumps({"group": [name]})},
    )

    class G:
        pass

    g = G()
    g.name, g.hook_path, g.queue_url = name, hook_path, queue_url
    g.mails = []

    def read_mail() -> list[str]:
        for m in sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=0).get(
            "Messages", []
        ):
            g.mails.append(m["Body"])
            sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=m["ReceiptHandle"])
        return g.mails

    g.read_mail = read_mail
    return g


def _gated_job(stack, project_id, group, **approval) -> str:
    secret = register_project(
        stack, project_id, GATED, group=group.name, approval={"enabled": True, **approval}
    )
    del secret
    job_id = RelevoApi.for_stack(stack).run_project(project_id, {"ref": "main"})["job_id"]
    task, _ = receive_stage(stack, job_id)
    agent_runs(stack, task)
    wait_until(lambda: job_record(stack, job_id).get("status") == "waiting", 15, "the gate")
    return job_id


@pytest.mark.parametrize("outcome", ["approved", "rejected", "timed out waiting for approval"])
def test_exactly_one_job_waiting_per_gate_then_its_outcome_and_nothing_more(
    local_stack, emulator, project_id, group, recorder, outcome
):
    job_id = _gated_job(
        local_stack, project_id, group, **({"timeout_sec": 2} if outcome.startswith("timed") else {})
    )
    api = RelevoApi.for_stack(local_stack)
    if outcome == "approved":
        api.approve(job_id)
        task, _ = receive_stage(local_stack, job_id)
        agent_runs(local_stack, task)
    elif outcome == "rejected":
        api.reject(job_id, "crash on launch in QA")
    described = wait_for_execution(local_stack, job_id, timeout=30)
    expected_titles = [f"{project_id}: deploy waits for approval"]
    if outcome == "approved":  # nothing more of the gate; the group opted in to job_succeeded
        expected_titles.append(f"{project_id}: job succeeded")
    else:  # the job's ending at the gate, under job_waiting, instead of job_failed
        expected_titles.append(f"{project_id}: deploy {outcome}")
    wait_until(
        lambda: len(recorder.received(group.hook_path)) >= len(expected_titles)
        and recorder.received(group.hook_path),
        20,
        "the Slack messages",
    )
    time.sleep(1.5)  # anything more would have come by now: the stream is read every 0.5 s
    messages = [r.json() for r in recorder.received(group.hook_path)]
    assert [m["text"] for m in messages] == expected_titles, described.get("error")
    assert all(check_message(m) == [] for m in messages)
    assert f"`relevo job approve {job_id}`" in json.dumps(messages[0])
    mails = wait_until(
        lambda: len(group.read_mail()) >= len(expected_titles) and group.mails, 10, "the emails"
    )
    assert [m.splitlines()[0] for m in mails] == expected_titles
    records = project_deliveries(local_stack.table_name, project_id)
    slack = sorted(r.event for r in records if r.target == "slack")
    assert sum(m["text"].endswith("waits for approval") for m in messages) == 1
    assert slack.count("job_waiting") == (1 if outcome == "approved" else 2) and "job_failed" not in slack
    # The webhook URL is a secret: in no record, marker, dead letter or log line.
    stored = json.dumps(
        table_items(local_stack, "DELIVERIES#") + table_items(local_stack, "NOTICES#"), default=str
    )
    log = (emulator.state_dir / "logs" / "StatusReporterFunction.log").read_text()
    assert group.hook_path not in stored and group.hook_path not in log


class InProcess:
    """The reporter as the function builds it, run here on the stack's table, with a clock the
    test moves."""

    def __init__(self, stack) -> None:
        self.t = datetime.now(UTC).timestamp()
        resources, table = stack.resources, stack.table_name
        settings = NotifySettings.model_validate(
            {
                "TABLE_NAME": table,
                "STATE_MACHINE_ARN": stack.state_machine_arn,
                "QUEUED_STATE_MACHINE_ARN": stack.queued_state_machine_arn,
                "STATUS_DEAD_LETTER_QUEUE_URL": resources["StatusDeadLetterQueue"],
                "GROUP_TOPIC_ARN": resources["GroupTopic"],
                "HTTP_READ_TIMEOUT_SEC": "2",
            }
        )
        self.reporter = Reporter(
            settings,
            Urllib3Transport(),
            Clock(now=lambda: self.t, sleep=lambda s: None),
            project=lambda p: get_project(table, p),
            secret=lambda name: client("secretsmanager").get_secret_value(SecretId=name)["SecretString"],
            group=lambda n: find_group(table, n),
            projects=lambda: list_projects(table),
        )

    def change(self, old, new) -> None:
        self.reporter.report_change(old, new, deadline=self.t + 30)  # on the reporter's clock


def _item(stack, pk: str, sk: str) -> dict:
    return from_attributes(
        client("dynamodb").get_item(TableName=stack.table_name, Key={"pk": {"S": pk}, "sk": {"S": sk}})[
            "Item"
        ]
    )


def test_agents_offline_pages_once_per_window_however_the_agent_flaps(
    local_stack, project_id, group, recorder
):
    register_project(local_stack, project_id, GATED[:1], group=group.name, region_affinity="us-east")
    here = InProcess(local_stack)
    table = local_stack.table_name
    agent_id = "mac-" + secrets.token_hex(3)

    def flap() -> None:
        """The agent comes online, then stops cleanly: the change the stream delivers."""
        now = datetime.fromtimestamp(here.t, UTC)
        agents.put_presence(
            table,
            agents.AgentPresence(
                agent_id=agent_id,
                region="us-east",
                capacity=1,
                running=0,
                version="1",
                last_seen=now,
                interval_sec=5,
            ),
        )
        old = _item(local_stack, "AGENTS#us-east", f"AGENT#{agent_id}")
        agents.mark_offline(table, "us-east", agent_id, now)
        here.change(old, _item(local_stack, "AGENTS#us-east", f"AGENT#{agent_id}"))

    def offline_pages() -> int:
        return sum(
            1 for r in recorder.received(group.hook_path) if r.json()["text"] == "no agent online in us-east"
        )

    flap()
    assert offline_pages() == 1
    here.t += 5 * 60
    flap()  # back and gone again five minutes later: the same outage, no second page
    assert offline_pages() == 1
    here.t += 6 * 60  # eleven minutes after the first page
    flap()
    assert offline_pages() == 2
    [message] = [r.json() for r in recorder.received(group.hook_path)][:1]
    assert check_message(message) == []


def test_a_frozen_key_is_told_once_per_freeze(local_stack, project_id, group, recorder):
    put_group(
        local_stack.table_name,
        find_group(local_stack.table_name, group.name).model_copy(
            update={"events": (GroupEvent.KEY_FROZEN,)}
        ),
        "test",
        datetime.now(UTC),
    )
    register_project(local_stack, project_id, GATED[:1], group=group.name)
    here = InProcess(local_stack)
    key_id = f"{project_id}:push:{secrets.token_hex(4)}"
    old = {"pk": f"FREEZE#{key_id}", "sk": "FREEZE", "project": project_id, "version": 1}
    new = {**old, "frozen_at": "2026-12-01T10:00:00+00:00", "kind": "frozen_key", "version": 2}
    here.change(old, new)
    here.change(old, new)  # the same record again
    here.change(
        new, {**new, "notified_at": "2026-12-01T10:00:01+00:00"}
    )  # the sweeper marks it notified: not a new freeze
    [message] = [r.json() for r in recorder.received(group.hook_path)]
    assert message["text"] == f"{project_id}: automatic runs of a key are frozen"
    assert f"`relevo dlq unfreeze {key_id}`" in json.dumps(message) and check_message(message) == []
