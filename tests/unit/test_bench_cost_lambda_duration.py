"""Lambda duration in bench/cost.py is priced from what the function does (its own CPU and the
count of its AWS calls at a stated latency on AWS each), never from how long the emulator took to
answer: a slower emulator, or a host loaded by other work, leaves the figure where it was."""

from __future__ import annotations

import contextvars
import threading
from typing import Any

import pytest

from bench import cost


class Clocks:
    """A CPU clock the handler advances by its own work, and a wall clock the emulator advances
    by its answers' time (nothing here reads the wall clock but the test)."""

    def __init__(self) -> None:
        self.cpu = 0.0
        self.wall = 0.0


def emulated_call(recorder: cost.Recorder, clocks: Clocks, service: str, op: str, answer_sec: float) -> None:
    """One AWS call answered by the emulator after `answer_sec`, recorded as the bench records it:
    the calling thread spends a little CPU on it, then waits."""
    clocks.cpu += 0.0005
    clocks.wall += answer_sec
    recorder.calls.append(
        cost.Call(
            source=str(cost._PHASE.get()),
            service=service,
            op=op,
            params={},
            response={},
            ok=True,
            thread=threading.current_thread().name,
        )
    )


def claim_like_handler(recorder: cost.Recorder, clocks: Clocks, answer_sec: float) -> dict[str, Any]:
    """The claim route's shape: 2 ms of its own work and five calls in sequence."""
    clocks.cpu += 0.002
    for service, op in (
        ("dynamodb", "Query"),
        ("dynamodb", "UpdateItem"),
        ("stepfunctions", "SendTaskSuccess"),
        ("dynamodb", "GetItem"),
        ("sts", "AssumeRole"),
    ):
        emulated_call(recorder, clocks, service, op, answer_sec)
    return {"statusCode": 200}


def metered(answer_sec: float) -> cost.Invocation:
    recorder = cost.Recorder()
    recorder.calls.append(  # a call of another phase before the invocation: not its own
        cost.Call("webhook", "dynamodb", "PutItem", {}, {}, True, threading.current_thread().name)
    )
    clocks = Clocks()
    meter = cost.Meter(recorder, cpu_clock=lambda: clocks.cpu)
    _, invocation = meter.run("claim", lambda: claim_like_handler(recorder, clocks, answer_sec))
    return invocation


def test_the_priced_duration_does_not_move_when_the_emulator_is_slower():
    # Given the same handler against an emulator answering in 2 ms, then in 3 s a call (a loaded host)
    fast = metered(0.002)
    slow = metered(3.0)
    # When each invocation is priced
    # Then both come to the same billed duration: the handler's 4.5 ms of CPU and its calls at
    # their latency on AWS (3 DynamoDB calls, 1 Step Functions, 1 STS), rounded up to the 1 ms
    # Lambda bills by
    expected = 0.0045 + (
        3 * cost.AWS_CALL_SEC["dynamodb"] + cost.AWS_CALL_SEC["stepfunctions"] + cost.AWS_CALL_SEC["sts"]
    )
    assert fast.billed_sec == slow.billed_sec
    assert fast.billed_sec == pytest.approx(-(-expected * 1000 // 1) / 1000)
    assert [f"{c.service}:{c.op}" for c in slow.calls] == [
        "dynamodb:Query",
        "dynamodb:UpdateItem",
        "stepfunctions:SendTaskSuccess",
        "dynamodb:GetItem",
        "sts:AssumeRole",
    ]


def test_the_priced_duration_follows_the_handlers_own_cpu_and_its_calls():
    # Given a handler that does more work of its own and one that makes one more call
    recorder = cost.Recorder()
    clocks = Clocks()
    meter = cost.Meter(recorder, cpu_clock=lambda: clocks.cpu)

    def busier() -> None:
        claim_like_handler(recorder, clocks, 0.002)
        clocks.cpu += 0.050

    def chattier() -> None:
        claim_like_handler(recorder, clocks, 0.002)
        emulated_call(recorder, clocks, "dynamodb", "UpdateItem", 0.002)

    # When each is metered
    _, base = meter.run("claim", lambda: claim_like_handler(recorder, clocks, 0.002))
    _, more_cpu = meter.run("claim", busier)
    _, more_calls = meter.run("claim", chattier)
    # Then 50 ms more CPU bills 50 ms more, and one more DynamoDB call its latency on AWS
    assert more_cpu.billed_sec - base.billed_sec == pytest.approx(0.050, abs=0.0011)
    assert more_calls.billed_sec - base.billed_sec == pytest.approx(
        cost.AWS_CALL_SEC["dynamodb"] + 0.0005, abs=0.0011
    )


def test_calls_made_beside_the_handler_thread_are_priced_as_one_wait():
    # Given a handler that hands two reads to threads of its own and waits for both
    recorder = cost.Recorder()
    clocks = Clocks()
    meter = cost.Meter(recorder, cpu_clock=lambda: clocks.cpu)

    def side_by_side() -> None:
        readers = [
            threading.Thread(
                # in the handler's context, as relevo_core.aws.in_this_context hands work over
                target=contextvars.copy_context().run,
                args=(emulated_call, recorder, clocks, "dynamodb", "GetItem", 1.0),
                name=f"reader-{n}",
            )
            for n in range(2)
        ]
        for reader in readers:
            reader.start()
        for reader in readers:
            reader.join()

    # When it is metered
    _, invocation = meter.run("claim", side_by_side)
    # Then the two reads cost one DynamoDB latency, not two
    assert len(invocation.calls) == 2
    assert invocation.aws_sec == pytest.approx(cost.AWS_CALL_SEC["dynamodb"])


def _burn(seconds: float) -> None:
    """Spend `seconds` of this thread's own CPU time."""
    import time

    began = time.thread_time()
    while time.thread_time() - began < seconds:
        pass


def test_cpu_spent_on_the_side_by_side_pool_is_billed_to_the_invocation():
    # Given a handler whose own thread does little and which hands 60 ms of work to the
    # side-by-side pool (relevo_core.aws.side_by_side: the claim route's reads and its job session)
    recorder = cost.Recorder()
    pool = cost.MeasuredPool()
    meter = cost.Meter(recorder, pool=pool)
    try:
        # When it is metered, and then a handler that does the same work on its own thread
        _, handed = meter.run("claim", lambda: pool.submit(_burn, 0.060).result())
        _, own = meter.run("claim", lambda: _burn(0.060))
    finally:
        pool.shutdown()
    # Then both bill the work: time.thread_time of the handler thread alone misses the pool's
    assert handed.cpu_sec >= 0.060
    assert own.cpu_sec >= 0.060
