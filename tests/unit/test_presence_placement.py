"""The placement decisions of relevo-agent (relevo_agent.placement), on their own (no AWS)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from relevo_agent.placement import HANDOFF_MAX_RECEIVES, handback_sec, prefer_another
from relevo_core.store.agents import AgentPresence

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def _agent(
    agent_id: str, capacity: int = 1, running: int = 0, age_sec: float = 0, online: bool = True
) -> AgentPresence:
    return AgentPresence(
        agent_id=agent_id,
        region="eu-west",
        capacity=capacity,
        running=running,
        version="0.1.0",
        last_seen=NOW - timedelta(seconds=age_sec),
        interval_sec=30,
        online=online,
    )


def _decide(avoid, region_agents, waited_sec: float = 0, receive_count: int = 1, agent_id: str = "mac-a"):
    chosen = prefer_another(agent_id, avoid, region_agents, NOW, waited_sec, receive_count, max_wait_sec=60)
    return chosen.agent_id if chosen else None


def test_an_agent_not_named_by_the_retry_takes_it():
    assert _decide([], [_agent("mac-b")]) is None
    assert _decide(["mac-b", ""], [_agent("mac-c")]) is None


def test_a_named_agent_leaves_it_to_the_freest_other_online_agent():
    region = [_agent("mac-a"), _agent("mac-b", capacity=2, running=1), _agent("mac-c", capacity=4, running=1)]
    assert _decide(["mac-a"], region) == "mac-c"


def test_a_named_agent_leaves_it_to_another_online_agent_even_a_busy_one():
    assert _decide(["mac-a"], [_agent("mac-a"), _agent("mac-b", running=1)]) == "mac-b"
    # Free slots still decide between several: the freest goes first.
    region = [
        _agent("mac-a"),
        _agent("mac-b", running=1),
        _agent("mac-c", capacity=2, running=2),
        _agent("mac-d", capacity=2, running=1),
    ]
    assert _decide(["mac-a"], region) == "mac-d"


@pytest.mark.parametrize(
    "others",
    [
        [],  # alone in the region
        [_agent("mac-b", age_sec=91)],  # not seen for more than 3 intervals
        [_agent("mac-b", running=1, age_sec=91)],  # busy when last seen, but not seen since
        [_agent("mac-b", online=False)],  # stopped cleanly
    ],
)
def test_a_named_agent_falls_back_to_itself_only_when_no_other_is_online(others):
    assert _decide(["mac-a"], [_agent("mac-a"), *others]) is None


def test_agents_that_also_failed_the_stage_are_no_better():
    assert _decide(["mac-a", "mac-b"], [_agent("mac-b")]) is None
    assert _decide(["mac-a", "mac-b"], [_agent("mac-b"), _agent("mac-c")]) == "mac-c"


@pytest.mark.parametrize("other", [_agent("mac-b"), _agent("mac-b", running=1)], ids=["free", "busy"])
def test_the_wait_for_another_agent_is_bounded(other):
    assert _decide(["mac-a"], [other], waited_sec=59) == "mac-b"
    assert _decide(["mac-a"], [other], waited_sec=60) is None
    assert _decide(["mac-a"], [other], receive_count=HANDOFF_MAX_RECEIVES - 1) == "mac-b"
    assert _decide(["mac-a"], [other], receive_count=HANDOFF_MAX_RECEIVES) is None


def test_a_retry_left_to_a_free_agent_is_visible_again_after_the_short_delay():
    assert handback_sec(_agent("mac-b"), waited_sec=0, receive_count=1, max_wait_sec=60, delay_sec=2) == 2
    assert (
        handback_sec(
            _agent("mac-b", capacity=2, running=1),
            waited_sec=40,
            receive_count=2,
            max_wait_sec=60,
            delay_sec=2,
        )
        == 2
    )


def test_a_retry_left_to_a_busy_agent_waits_in_equal_hops_up_to_the_bound():
    busy = _agent("mac-b", running=1)
    # Two receives left before the bound: the 60 s wait is split in two hops of 30 s...
    assert handback_sec(busy, waited_sec=0, receive_count=1, max_wait_sec=60, delay_sec=2) == 30
    # ...the second receive, 30 s later, waits out the rest, so the third comes at the bound.
    assert handback_sec(busy, waited_sec=30, receive_count=2, max_wait_sec=60, delay_sec=2) == 30
    assert _decide(["mac-a"], [busy], waited_sec=60, receive_count=3) is None
    # Never shorter than the short delay, whole seconds for SQS.
    assert handback_sec(busy, waited_sec=59.5, receive_count=2, max_wait_sec=60, delay_sec=2) == 2
    assert handback_sec(busy, waited_sec=10.5, receive_count=2, max_wait_sec=60, delay_sec=2) == 50


def test_the_named_agent_receives_a_retry_for_a_busy_agent_at_most_the_bounded_number_of_times():
    """Walk the hand-backs as SQS would redeliver them: the named agent takes the stage at the
    bound, having received it HANDOFF_MAX_RECEIVES times (below the queue's maxReceiveCount 5)."""
    busy = [_agent("mac-b", running=1)]
    waited, receives = 0.0, 1
    while (
        other := prefer_another("mac-a", ["mac-a"], busy, NOW, waited, receives, max_wait_sec=60)
    ) is not None:
        waited += handback_sec(other, waited, receives, max_wait_sec=60, delay_sec=2)
        receives += 1
    assert (waited, receives) == (60, HANDOFF_MAX_RECEIVES)


def _previous(
    region_agents, waited_sec: float = 0, receive_count: int = 1, requires=None, limit_sec: float = 10
):
    from relevo_agent.placement import previous_mac

    chosen = previous_mac("mac-b", requires or {}, region_agents, NOW, waited_sec, receive_count, limit_sec)
    return chosen.agent_id if chosen else None


def test_a_next_stage_is_left_to_the_mac_that_ran_the_previous_one_for_a_short_bound():
    """Where its files are (docs/handoff.md, Placement): while that Mac is online with a free slot."""
    assert _previous([_agent("mac-a"), _agent("mac-b")]) == "mac-b"
    assert _previous([_agent("mac-b")], waited_sec=9.9) == "mac-b"
    # then any Mac takes it: the bound passed, or it went round too often
    assert _previous([_agent("mac-b")], waited_sec=10) is None
    assert _previous([_agent("mac-b")], receive_count=HANDOFF_MAX_RECEIVES) is None
    assert _previous([_agent("mac-b")], limit_sec=0) is None


def test_a_busy_offline_paused_or_unfit_previous_mac_is_not_waited_for():
    from relevo_core.models.capabilities import Capabilities

    assert _previous([_agent("mac-b", running=1)]) is None
    assert _previous([_agent("mac-b", online=False)]) is None
    assert _previous([_agent("mac-b", age_sec=120)]) is None  # silent for 3 intervals: offline
    assert _previous([_agent("mac-b").model_copy(update={"not_claiming": "agent_paused"})]) is None
    fit = _agent("mac-b").model_copy(
        update={"capabilities": Capabilities(os="darwin", arch="arm64", xcode="16.2")}
    )
    assert _previous([fit], requires={"xcode": "16.*"}) == "mac-b"
    assert _previous([fit], requires={"xcode": "15.*"}) is None
    assert _previous([_agent("mac-c")]) is None  # it is gone from the region


STAGE = "job_x:test"


def _spread(
    held_here: int, region_agents, waited_sec: float = 0, receive_count: int = 1, avoid=(), requires=None
):
    from relevo_agent.placement import spread_to

    chosen = spread_to(
        "mac-a",
        STAGE,
        held_here,
        requires or {},
        avoid,
        region_agents,
        NOW,
        waited_sec,
        receive_count,
        max_wait_sec=60,
    )
    return chosen.agent_id if chosen else None


def _holding(agent_id: str, shards: int, capacity: int = 4, other_stage_shards: int = 0) -> AgentPresence:
    return _agent(agent_id, capacity=capacity, running=shards + other_stage_shards).model_copy(
        update={"shard_stages": (STAGE,) * shards + ("job_y:test",) * other_stage_shards}
    )


def test_an_agent_holding_no_shard_of_the_stage_takes_the_shard_without_reading_anything():
    assert _spread(0, [_holding("mac-b", 0)]) is None


def test_a_second_shard_goes_to_a_free_mac_holding_fewer_of_the_stage_fewest_first():
    # Shards of another stage do not count, only the free slots they leave.
    assert _spread(1, [_holding("mac-b", 0, other_stage_shards=2)]) == "mac-b"
    assert _spread(2, [_holding("mac-b", 1), _holding("mac-c", 0, capacity=2)]) == "mac-c"
    # Between Macs holding as few, the freest.
    assert _spread(1, [_holding("mac-b", 0, capacity=2), _holding("mac-c", 0, capacity=8)]) == "mac-c"


def test_shards_share_a_mac_only_when_no_other_mac_holds_fewer_and_has_a_free_slot():
    assert _spread(1, [_holding("mac-b", 1)]) is None  # as many there: evenly spread already
    assert _spread(1, [_holding("mac-b", 0, capacity=1, other_stage_shards=1)]) is None  # full
    assert _spread(1, []) is None  # alone in the region
    assert _spread(1, [_holding("mac-b", 0).model_copy(update={"online": False})]) is None
    assert _spread(1, [_holding("mac-b", 0).model_copy(update={"not_claiming": "agent_paused"})]) is None


def test_a_shards_retry_is_not_spread_to_the_mac_that_failed_it_nor_to_one_missing_its_requirements():
    from relevo_core.models.capabilities import Capabilities

    assert _spread(1, [_holding("mac-b", 0)], avoid=("mac-b",)) is None
    old_xcode = _holding("mac-b", 0).model_copy(
        update={"capabilities": Capabilities(os="darwin", arch="arm64", xcode="15.4")}
    )
    assert _spread(1, [old_xcode], requires={"xcode": "16.*"}) is None


def test_the_spread_is_bounded_like_a_retrys_hand_back():
    assert _spread(1, [_holding("mac-b", 0)], waited_sec=59) == "mac-b"
    assert _spread(1, [_holding("mac-b", 0)], waited_sec=60) is None
    assert _spread(1, [_holding("mac-b", 0)], receive_count=HANDOFF_MAX_RECEIVES) is None


def test_the_presence_record_lists_the_stage_of_each_shard_held_and_counts_the_ones_before():
    from pathlib import Path

    from relevo_agent.config import AgentConfig
    from relevo_agent.presence import Presence
    from relevo_agent.stop import AgentStop

    presence = Presence(
        AgentConfig(agent_id="mac-a", region="eu", capacity=4, journal=Path("/nonexistent/j")),
        "table",
        AgentStop(),
    )
    with (
        presence.occupied(STAGE) as first,
        presence.occupied(None) as unsharded,
        presence.occupied(STAGE) as second,
    ):
        assert (first, unsharded, second) == (0, 0, 1)
        record = presence._record()
        assert (record.running, record.shards_of(STAGE)) == (3, 2)
    record = presence._record()
    assert (record.running, record.shard_stages) == (0, ())


class _Time:
    """The injected clocks: a wait on the agent's stop moves both on, no real time passes."""

    def __init__(self) -> None:
        self.elapsed = 0.0
        self.waits: list[float] = []

    def now(self) -> datetime:
        return NOW + timedelta(seconds=self.elapsed)

    def monotonic(self) -> float:
        return 1000.0 + self.elapsed

    # AgentStop's face
    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout or 0.0)
        self.elapsed += timeout or 0.0
        return False

    def is_set(self) -> bool:
        return False


class _Message:
    """A received stage message: what the agent did with it, and when (by the injected clock)."""

    def __init__(self, clock: _Time, receive_count: int = 1) -> None:
        self.clock = clock
        self.receive_count = receive_count
        self.sent_at = clock.now()
        self.visibility: list[tuple[float, int]] = []  # (at, seconds invisible from then)
        self.resent: list[int] = []

    def hide_for(self, seconds: int) -> None:
        self.visibility.append((self.clock.elapsed, seconds))

    def give_back_after(self, seconds: int, tries: int = 3) -> None:
        self.hide_for(seconds)

    def give_back(self) -> None:
        self.hide_for(0)

    def resend(self, delay_sec: int) -> None:
        self.resent.append(delay_sec)


def _placement(clock: _Time, monkeypatch, region_at, **config):
    from pathlib import Path

    from relevo_agent import placement as placement_module
    from relevo_agent.config import AgentConfig
    from relevo_agent.placement import Placement

    looks: list[float] = []

    def online_agents(table, region, now):
        looks.append(clock.elapsed)
        return region_at(clock.elapsed)

    monkeypatch.setattr(placement_module.agents, "online_agents", online_agents)
    agent_config = AgentConfig(
        agent_id="mac-a", region="eu", journal=Path("/nonexistent/j"), **{"capacity": 1, **config}
    )
    return Placement(agent_config, "table", clock, clock=clock.now, monotonic=clock.monotonic), looks


def test_a_retry_handed_back_to_busy_agents_is_visible_again_within_a_look_of_a_slot_freeing(monkeypatch):
    """Issue 42, finding 3: the retry waited out a 30 s hop while the siblings had freed their slots."""
    from relevo_agent.placement import HANDBACK_LOOK_SEC, PASSED_ON_QUIET_SEC

    # Given mac-a ran the failed attempt, and mac-b, the only other agent, is busy until 3.2 s from now
    clock = _Time()
    frees_at = 3.2
    placement, looks = _placement(
        clock, monkeypatch, lambda t: [_agent("mac-a"), _agent("mac-b", running=0 if t >= frees_at else 1)]
    )
    message = _Message(clock)

    # When mac-a receives the retry, and hands it back
    assert placement.leave_to_another(["mac-a"], 600, message, "job/test attempt 2")
    for watch in placement.watches:
        watch.join(timeout=10)

    # Then it is hidden for the busy agent's hop, and visible again within a look of mac-b's slot freeing
    (hidden_at, hop), (shown_at, shown) = message.visibility
    assert (hidden_at, hop, shown) == (0.0, 30, 0)
    assert frees_at <= shown_at <= frees_at + HANDBACK_LOOK_SEC
    # (mac-a starts no receive of its own for a moment, so mac-b's poll takes it)
    assert placement.quiet_until == clock.monotonic() - clock.elapsed + shown_at + PASSED_ON_QUIET_SEC
    assert len(looks) == 2 + int(
        frees_at / HANDBACK_LOOK_SEC
    )  # the decision's read, then a look every HANDBACK_LOOK_SEC

    # When a receive of mac-a's that was under way gets it back first (its new ones wait)
    clock.elapsed += 0.4
    again = _Message(clock, receive_count=2)
    assert placement.leave_to_another(["mac-a"], 600, again, "job/test attempt 2")

    # Then it is visible again at once too, and no slot of mac-a's is held for it
    assert (again.visibility, clock.waits.count(3)) == ([(clock.elapsed, 0)], 0)


def test_a_retry_whose_agents_stay_busy_waits_its_hop_and_the_watch_ends_before_it(monkeypatch):
    from relevo_agent.placement import HANDBACK_LOOK_SEC, HANDBACK_MARGIN_SEC

    # Given every other agent stays busy, or frees a slot it could not take the retry with
    clock = _Time()
    paused = _agent("mac-c").model_copy(update={"not_claiming": "agent_paused"})
    placement, looks = _placement(
        clock,
        monkeypatch,
        lambda t: [
            _agent("mac-a"),
            _agent("mac-b", running=1),
            paused if t >= 3 else _agent("mac-c", running=1),
        ],
    )
    message = _Message(clock)

    # When mac-a hands the retry back
    assert placement.leave_to_another(["mac-a"], 600, message, "job/test attempt 2")
    for watch in placement.watches:
        watch.join(timeout=10)

    # Then it stays hidden for its hop, and nothing touches its receipt once the hop nears its end
    assert message.visibility == [(0.0, 30)]
    assert clock.elapsed <= 30 - HANDBACK_MARGIN_SEC
    assert len(looks) - 1 == int((30 - HANDBACK_MARGIN_SEC) / HANDBACK_LOOK_SEC) - 1


def test_the_free_agent_for_a_retry_is_online_claiming_free_unnamed_and_fit():
    from relevo_agent.placement import free_for
    from relevo_core.models.capabilities import Capabilities

    def found(region, requires=None):
        chosen = free_for("mac-a", ["mac-a", "mac-x"], requires or {}, region, NOW)
        return chosen.agent_id if chosen else None

    assert found([_agent("mac-a"), _agent("mac-b")]) == "mac-b"
    assert found([_agent("mac-b", running=1)]) is None
    assert found([_agent("mac-x")]) is None  # it failed the stage too
    assert found([_agent("mac-b", online=False)]) is None
    assert found([_agent("mac-b").model_copy(update={"not_claiming": "agent_low_disk"})]) is None
    old = _agent("mac-b").model_copy(
        update={"capabilities": Capabilities(os="darwin", arch="arm64", xcode="15.4")}
    )
    assert found([old], requires={"xcode": "16.*"}) is None


def test_a_next_stage_passed_on_to_the_previous_mac_is_visible_again_at_once_and_holds_no_slot(monkeypatch):
    """Issue 42, finding 4: it was hidden for 2 s and this agent's slot held 3 s, and the previous
    Mac then raced every other idle agent for it."""
    from relevo_agent.placement import PASSED_ON_QUIET_SEC

    # Given mac-b ran the job's previous stage and waits for work
    clock = _Time()
    placement, _ = _placement(clock, monkeypatch, lambda t: [_agent("mac-a"), _agent("mac-b")])
    message = _Message(clock)

    # When mac-a receives the next stage and passes it on
    assert placement.leave_to_previous("mac-b", {}, message, "job/sign")

    # Then it is sent again for at once (a send wakes mac-b's long poll), nothing is waited for,
    # and mac-a starts no receive of its own for a moment
    assert (message.resent, message.visibility, clock.waits) == ([0], [], [])
    assert placement.quiet_until == clock.monotonic() + PASSED_ON_QUIET_SEC


@pytest.mark.parametrize(
    "previous",
    [
        _agent("mac-b", running=1),  # busy
        _agent("mac-b", age_sec=120),  # absent: silent for 3 intervals
        _agent("mac-b", online=False),  # stopped
        _agent("mac-b").model_copy(update={"not_claiming": "agent_paused"}),
    ],
    ids=["busy", "silent", "stopped", "paused"],
)
def test_a_previous_mac_that_does_not_wait_for_work_is_not_waited_for(monkeypatch, previous):
    # Given the Mac that ran the previous stage is not waiting for work
    clock = _Time()
    placement, _ = _placement(clock, monkeypatch, lambda t: [_agent("mac-a"), previous])
    message = _Message(clock)

    # When mac-a receives the next stage, Then it takes it here: nothing passed on or waited for
    assert not placement.leave_to_previous("mac-b", {}, message, "job/sign")
    assert (message.resent, message.visibility, clock.waits, placement.quiet_until) == ([], [], [], 0.0)


def test_a_next_stage_is_passed_on_only_within_prefer_previous_sec(monkeypatch):
    clock = _Time()
    placement, looks = _placement(clock, monkeypatch, lambda t: [_agent("mac-b")], prefer_previous_sec=10)
    message = _Message(clock)
    clock.elapsed = 10.0  # the stage was sent 10 s ago
    assert not placement.leave_to_previous("mac-b", {}, message, "job/sign")
    assert looks == []  # past the bound, nothing is even read


def test_a_caches_stage_is_offered_to_the_macs_holding_its_entries_after_the_previous_stages_mac():
    """Issue 46, point 3 (relevo_core.fleet.warm_macs): the claim route names the Macs better placed
    than the one claiming, best first: where the previous stage's files wait, then the Macs that
    most recently saved or restored an entry of the stage's caches."""
    from relevo_core.fleet.warm_macs import MAX_CACHE_MACS, ranked

    holders = {"mac-c": "2026-11-29T11:00:00+00:00", "mac-d": "2026-11-29T11:30:00+00:00"}
    # Given no files wait anywhere, Then the holders are offered, the most recent first
    assert ranked(None, holders, "mac-a") == ["mac-d", "mac-c"]
    # Given the previous stage's files wait on mac-b, Then they outrank every cache
    assert ranked("mac-b", holders, "mac-a") == ["mac-b", "mac-d", "mac-c"]
    assert ranked("mac-c", holders, "mac-a") == ["mac-c", "mac-d"]
    # Given the claiming Mac holds the files, or holds the cache as recently as the rest, it takes it
    assert ranked("mac-a", holders, "mac-a") == []
    assert ranked(None, holders, "mac-d") == []
    assert ranked(None, holders, "mac-c") == ["mac-d"]
    assert ranked(None, {}, "mac-a") == []
    # and only the most recent holders are named
    many = {f"mac-{n}": f"2026-11-29T11:{n:02d}:00+00:00" for n in range(10)}
    assert ranked(None, many, "mac-a") == [f"mac-{n}" for n in range(9, 9 - MAX_CACHE_MACS, -1)]


def _warm(region_agents, waited_sec: float = 0, receive_count: int = 1, requires=None):
    from relevo_agent.placement import previous_mac

    chosen = previous_mac(
        ["mac-b", "mac-c"], requires or {}, region_agents, NOW, waited_sec, receive_count, limit_sec=10
    )
    return chosen.agent_id if chosen else None


def test_a_mac_holding_the_cache_is_waited_for_within_the_bound_only_when_the_better_ones_do_not_wait():
    from relevo_core.models.capabilities import Capabilities

    # Given the route named mac-b (the previous stage's files) then mac-c (the stage's cache)
    # Then the previous stage's Mac wins while it waits for work
    assert _warm([_agent("mac-b"), _agent("mac-c")]) == "mac-b"
    # and the cache's Mac is waited for when mac-b is busy, absent, paused or unfit
    for not_waiting in (
        _agent("mac-b", running=1),
        _agent("mac-b", age_sec=120),
        _agent("mac-b", online=False),
        _agent("mac-b").model_copy(update={"not_claiming": "agent_paused"}),
    ):
        assert _warm([not_waiting, _agent("mac-c")]) == "mac-c"
    assert _warm([_agent("mac-c")], waited_sec=9.9) == "mac-c"
    # but never past the bound, nor when it does not wait for work itself, nor against requires
    assert _warm([_agent("mac-c")], waited_sec=10) is None
    assert _warm([_agent("mac-c")], receive_count=HANDOFF_MAX_RECEIVES) is None
    assert _warm([_agent("mac-b", running=1), _agent("mac-c", running=1)]) is None
    assert _warm([_agent("mac-c", age_sec=120)]) is None
    fit = _agent("mac-c").model_copy(
        update={"capabilities": Capabilities(os="darwin", arch="arm64", xcode="16.2")}
    )
    assert _warm([fit], requires={"xcode": "16.*"}) == "mac-c"
    assert _warm([fit], requires={"xcode": "15.*"}) is None


def test_a_caches_stage_passed_on_to_a_holder_goes_to_the_first_named_mac_that_waits(monkeypatch):
    # Given mac-b (named first) is busy and mac-c, which restored the stage's cache, waits for work
    clock = _Time()
    region = [_agent("mac-a"), _agent("mac-b", running=1), _agent("mac-c")]
    placement, _ = _placement(clock, monkeypatch, lambda t: region)
    message = _Message(clock)

    # When mac-a receives the stage, Then it is sent again at once for mac-c, nothing waited for
    assert placement.leave_to_previous(["mac-b", "mac-c"], {}, message, "job/build")
    assert (message.resent, message.visibility, clock.waits) == ([0], [], [])


def test_placement_is_a_module_apart_from_the_presence_record():
    """Issue 43: presence.py held the presence record and every placement decision (685 lines)."""
    from pathlib import Path

    from relevo_agent import placement, presence

    # Given the agent's presence writer and its placement
    # Then the writer decides nothing of where a stage runs, and each module stays readable
    assert not [
        name for name in vars(presence.Presence) if name.startswith(("leave_to_", "watch_", "quiet_"))
    ]
    for module in (presence, placement):
        lines = len(Path(module.__file__).read_text(encoding="utf-8").splitlines())
        assert lines < 470, f"{module.__name__}: {lines} lines"


def test_a_retry_left_to_a_free_agent_keeps_every_slot_of_the_leaving_agent_off_the_queue(monkeypatch):
    """An agent of capacity 2 left a retry to a free agent: its other free slot's poll received
    the message back when it was visible again, twice, and the third receive ran it on the agent
    that failed it (tests/e2e/test_parallel_shards.py, on a loaded host). Now no receive of the
    leaving agent starts until the message is visible again and a second more."""
    # Given mac-a ran the failed attempt, and mac-b is online with a free slot
    clock = _Time()
    placement, _ = _placement(clock, monkeypatch, lambda t: [_agent("mac-a"), _agent("mac-b")], capacity=2)
    message = _Message(clock)

    # When mac-a receives the retry and leaves it to mac-b
    left_at = clock.monotonic()
    assert placement.leave_to_another(["mac-a"], 600, message, "job/test attempt 2")

    # Then the message is invisible for the short delay, and mac-a's receives (every slot's) wait
    # until it is visible again and a second more
    assert message.visibility == [(0.0, 2)]
    assert placement.quiet_until == left_at + 2 + 1
