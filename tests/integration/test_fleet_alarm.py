"""The zero-online-agents alarm's input: functions/sweeper/handler.py counts every region of the
stack's list on the embedded stack, and prints one OnlineAgents document per region."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime

import pytest

from relevo_core.aws import client
from relevo_core.config.sweeper import sweeper_settings
from relevo_core.store import agents
from relevo_core.store.agents import AgentPresence
from tests.helpers.stack import LambdaContext, emf_documents, load_handler, metrics_printed


@pytest.fixture
def sweeper_env(local_stack, monkeypatch):
    """The sweeper's environment as deployed, with two regions of this test's own in place of the
    stack's list (nobody else writes presence there); returns those regions."""
    deployed = client("lambda").get_function_configuration(
        FunctionName=local_stack.resources["SweeperFunction"]
    )
    variables = {name: str(value) for name, value in deployed["Environment"]["Variables"].items()}
    # The template hands the sweeper the stack's region list (the RegionAffinities parameter).
    assert variables["REGION_AFFINITIES"] == ",".join(sorted(local_stack.work_queues))
    regions = ("fleet-" + secrets.token_hex(3), "fleet-" + secrets.token_hex(3))
    for name, value in {**variables, "REGION_AFFINITIES": ",".join(regions)}.items():
        if not name.startswith("AWS_"):
            monkeypatch.setenv(name, value)
    metrics_printed(monkeypatch)
    sweeper_settings.cache_clear()
    yield regions
    sweeper_settings.cache_clear()


def _online_agents_printed(stdout: str) -> dict[str, list[float]]:
    counts: dict[str, list[float]] = {}
    for document in emf_documents(stdout):
        for directive in document["_aws"]["CloudWatchMetrics"]:
            for metric in directive["Metrics"]:
                if metric["Name"] != "OnlineAgents":
                    continue
                # The alarm's dimensions, exactly: any other set would be another metric.
                assert directive["Dimensions"] == [["Region", "service"]]
                assert (document["service"], metric["Unit"]) == ("relevo", "Count")
                counts.setdefault(document["Region"], []).extend(document["OnlineAgents"])
    return counts


def test_a_sweep_counts_every_region_even_one_nobody_ever_joined(local_stack, sweeper_env, capsys):
    first, second = sweeper_env
    handler = load_handler("sweeper")

    capsys.readouterr()
    response = handler({}, LambdaContext("SweeperFunction"))
    assert _online_agents_printed(capsys.readouterr().out) == {first: [0], second: [0]}
    assert response["online_agents"] == {first: 0, second: 0}

    # An agent of the first region writes its presence now; one of the second stopped cleanly.
    now = datetime.now(UTC)
    agents.put_presence(
        local_stack.table_name,
        AgentPresence(
            agent_id="mac-1",
            region=first,
            capacity=2,
            running=0,
            version="0.1.0",
            last_seen=now,
            interval_sec=30,
        ),
    )
    agents.put_presence(
        local_stack.table_name,
        AgentPresence(
            agent_id="mac-2",
            region=second,
            capacity=1,
            running=0,
            version="0.1.0",
            last_seen=now,
            interval_sec=30,
        ),
    )
    agents.mark_offline(local_stack.table_name, second, "mac-2", now)

    response = handler({}, LambdaContext("SweeperFunction"))
    assert _online_agents_printed(capsys.readouterr().out) == {first: [1], second: [0]}
    assert response["online_agents"] == {first: 1, second: 0}


def test_the_stack_has_a_zero_online_alarm_per_region_that_treats_silence_as_breaching(local_stack):
    """The alarms as deployed on the embedded stack (created through the CloudWatch API)."""
    topic = local_stack.resources["NotificationTopic"]
    for region in local_stack.work_queues:
        suffix = "".join(ch for ch in region if ch.isalnum())
        [alarm] = client("cloudwatch").describe_alarms(
            AlarmNames=[f"{local_stack.stack_name}-OnlineAgentsAlarm{suffix}"]
        )["MetricAlarms"]
        assert (alarm["Namespace"], alarm["MetricName"]) == ("Relevo", "OnlineAgents")
        assert sorted((d["Name"], d["Value"]) for d in alarm["Dimensions"]) == [
            ("Region", region),
            ("service", "relevo"),
        ]
        assert (alarm["ComparisonOperator"], alarm["Threshold"]) == ("LessThanThreshold", 1.0)
        assert alarm["TreatMissingData"] == "breaching"
        assert alarm["AlarmActions"] == [topic]
