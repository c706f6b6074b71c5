"""How the agent stops (relevo_agent.stop.AgentStop) and counts its capacity (relevo_agent.slots.Slots).

Given one AgentStop that every loop of an agent holds, when the stack's table or queue turns out
gone, then it stops ungracefully with one line naming what is gone, and the first reason stands;
a network fault or any other error stops nothing. Given Slots, a slot held through an empty long
poll is no running stage, and a slot given back twice is a mistake said at once.
"""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError

from relevo_agent.slots import Slots
from relevo_agent.stop import AgentStop


def _error(code: str) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": code}}, "Operation")


def test_a_table_that_is_gone_stops_the_agent_with_one_line_naming_it():
    stop = AgentStop("relevo-Table-1", "https://sqs/q", follow_stack=False)

    assert stop.stack_gone(_error("ResourceNotFoundException"))

    assert stop.is_set() and stop.wait(0) and stop.stack_moved
    assert stop.fatal == (
        "the stack is gone: the table relevo-Table-1 does not exist (ResourceNotFoundException); "
        "exiting so that a restart reads the stack file again"
    )


@pytest.mark.parametrize("code", ["AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist"])
def test_a_queue_that_is_gone_is_said_as_the_work_queue_and_a_follower_starts_again(code: str):
    stop = AgentStop("t", "https://sqs/q", follow_stack=True)

    assert stop.stack_gone(_error(code))

    assert (
        stop.fatal
        == f"the stack is gone: the work queue https://sqs/q does not exist ({code}); starting again once "
        "the stack file names a stack"
    )


@pytest.mark.parametrize(
    "exc",
    [_error("ThrottlingException"), EndpointConnectionError(endpoint_url="http://x"), None, ValueError("x")],
)
def test_any_other_error_stops_nothing(exc):
    stop = AgentStop("t", "q")

    assert not stop.stack_gone(exc)
    assert not stop.is_set() and stop.fatal is None


def test_the_first_reason_stands_and_a_graceful_stop_has_none():
    stop = AgentStop()
    stop.gracefully()
    assert stop.is_set() and stop.fatal is None

    stop.ungracefully("another process is this agent now")
    stop.ungracefully("the stack file names another stack", stack_moved=True)

    assert stop.fatal == "another process is this agent now" and not stop.stack_moved


def test_a_slot_held_through_an_empty_poll_is_no_running_stage():
    slots = Slots(2)

    assert slots.hold(0) and slots.idle()  # the long poll: held, nothing runs
    slots.started()
    assert slots.hold(0) and slots.running == 1
    assert not slots.hold(0)  # both held: the poll takes no message it could not start
    slots.release()  # the second receive came back empty
    slots.ended()
    assert slots.idle() and slots.hold(0) and slots.hold(0)


def test_a_slot_given_back_twice_is_said_at_once():
    slots = Slots(1)
    assert slots.hold(0)
    slots.release()

    with pytest.raises(ValueError):
        slots.release()
