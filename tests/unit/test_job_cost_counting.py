"""Counting a job's cost from history events of the shapes GetExecutionHistory returns."""

from __future__ import annotations

import pytest

from relevo_core.jobs import cost


def _scheduled(resource_type: str, resource: str) -> dict:
    return {
        "type": "TaskScheduled",
        "taskScheduledEventDetails": {"resourceType": resource_type, "resource": resource},
    }


def test_reads_writes_queue_sends_and_invocations_are_priced_apart():
    events = [
        {"type": "ExecutionStarted"},
        {"type": "TaskStateEntered"},
        _scheduled("dynamodb", "getItem"),
        {"type": "TaskSucceeded"},
        {"type": "TaskStateEntered"},
        _scheduled("dynamodb", "updateItem"),
        {"type": "TaskStateEntered"},
        _scheduled("sqs", "sendMessage.waitForTaskToken"),
        {"type": "ChoiceStateEntered"},
        {"type": "ChoiceStateExited"},
        {"type": "TaskStateEntered"},
        _scheduled("lambda", "invoke"),
        {"type": "LambdaFunctionScheduled"},
        {"type": "TaskStateEntered"},
        _scheduled("states", "startExecution"),
        {"type": "SucceedStateEntered"},
        {"type": "ExecutionSucceeded"},
    ]
    counted = cost.count_history(events)
    assert (
        counted.transitions,
        counted.dynamodb_reads,
        counted.dynamodb_writes,
        counted.sqs_requests,
        counted.lambda_invocations,
    ) == (7, 1, 1, 1, 2)
    assert counted.other_requests == {"states": 1}
    assert counted.dollars == pytest.approx(
        7 * cost.SFN_PER_TRANSITION
        + cost.DDB_PER_RRU
        + cost.DDB_PER_WRU
        + cost.SQS_PER_REQUEST
        + 2 * cost.LAMBDA_PER_REQUEST
    )


def test_an_empty_history_costs_nothing():
    assert cost.count_history([]).dollars == 0
