"""What a running stage costs a minute (bench/cost.py stage_minute): the lease's renewals and the
task's heartbeats through the heartbeat route, each an API Gateway request and a Lambda
invocation, counted at the intervals relevo_core.fleet.lease_timeline gives them."""

from __future__ import annotations

import pytest

from bench import cost


def test_a_stage_minute_counts_each_heartbeat_as_a_route_call_every_third_of_the_lease():
    # Given the default lease (60 s: renewed every 3 s, heartbeaten every 20 s) and a route call
    # of 0.1 s
    # When a minute of a running stage is priced
    minute = cost.stage_minute(60, 0.1)
    before = cost.stage_minute(60, 0.1, every_renewal=True)
    # Then it is 20 renewals of 1 WRU and 3 heartbeat route calls (20 before the heartbeat got
    # its own interval), each an API Gateway request, a Lambda invocation and its duration
    assert (minute.renewals, minute.heartbeats) == (20, 3)
    assert (before.renewals, before.heartbeats) == (20, 20)
    beat = (
        cost.API_GATEWAY_PER_REQUEST
        + cost.LAMBDA_PER_REQUEST
        + cost.CLAIM_MEMORY_GB * 0.1 * cost.LAMBDA_PER_GB_S
    )
    assert minute.dollars == pytest.approx((20 * cost.DDB_PER_WRU + 3 * beat) * 1000)
    assert before.dollars - minute.dollars == pytest.approx(17 * beat * 1000)
