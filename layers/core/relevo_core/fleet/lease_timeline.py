"""The lease timeline: when an attempt's holder renews, fences itself, and when a successor may
claim and probe. One definition for the agent, `relevo-tools drill` and the table in docs/architecture.md.

All times count from the send time of the holder's last successful renewal (its lease renewal
followed by its task heartbeat), on the holder's monotonic clock:

    0                      renewal sent (and, right after it, the task heartbeat when one is due:
                           every heartbeat_interval, lease/3)
    renew_interval         the next renewal is due; every min(lease/3, 3 s)
    fence_after            lease - margin: the holder sends SIGTERM to the stage's process group,
                           withholds the result and journals the attempt as fenced; the dead-man
                           supervisor does the same if the holder is frozen
    kill_after             lease - skew: SIGKILL to whatever is left of the group
    lease                  the lease ends (HeartbeatSeconds = lease_ttl_sec): the state machine
                           gives the attempt up no earlier, so the next attempt is claimed no
                           earlier than this (plus the retry's backoff)
    lease + skew           the earliest the successor's effect probe (or re-run) may start, by
                           the successor's own clock, against the lease end the holder recorded

margin = kill grace + allowed skew. The grace is cut short when the lease leaves no room for two
renewals before the fence (a lease shorter than kill_grace_sec + skew + 2 renew intervals): the
group then gets a shorter SIGTERM grace, but is still dead `skew` before the lease ends. A lease
that leaves no room for one renewal before the fence is refused by the agent. The allowed skew is
the agent's `max_clock_skew_sec`, the same number `relevo-agent doctor` fails on.
"""

from __future__ import annotations

from dataclasses import dataclass

# How often the holder renews at most: bounds how long a cancel takes to reach the stage.
RENEW_INTERVAL_MAX_SEC = 3.0
# The allowed clock skew between an agent and AWS (the agent's max_clock_skew_sec default).
MAX_CLOCK_SKEW_SEC = 5.0
# After a failed renewal, the next try comes this soon (a reset fails fast; a partition times out).
RETRY_AFTER_FAILURE_SEC = 0.25


@dataclass(frozen=True)
class LeaseTimeline:
    lease_ttl_sec: float
    kill_grace_sec: float
    max_clock_skew_sec: float = MAX_CLOCK_SKEW_SEC

    @property
    def renew_interval_sec(self) -> float:
        return min(self.lease_ttl_sec / 3, RENEW_INTERVAL_MAX_SEC)

    @property
    def heartbeat_interval_sec(self) -> float:
        """How often the holder heartbeats the task (through its region's heartbeat route): lease/3,
        three heartbeats in each HeartbeatSeconds (= lease_ttl_sec) window, never more often than
        the lease is renewed. The lease's own write keeps renew_interval_sec (the fence and a
        cancel ride on it); the heartbeat only keeps the state machine from giving the attempt up,
        and SendTaskHeartbeat is 500/s per account: 1,000 stages at every 3 s were 333/s (1.5x
        headroom), at lease/3 (20 s by default) 50/s (bench/scale.py)."""
        return max(self.renew_interval_sec, self.lease_ttl_sec / 3)

    def heartbeat_due(self, last_sent: float | None, now: float) -> bool:
        """Whether a renewal sent at `now` also heartbeats the task, the last heartbeat having been
        sent at `last_sent` (None: none yet since the run token was handed). Renewals come every
        renew_interval_sec, so the gap is at most heartbeat_interval_sec + renew_interval_sec
        (23 s by default): far inside HeartbeatSeconds."""
        return last_sent is None or now - last_sent >= self.heartbeat_interval_sec

    @property
    def feasible(self) -> bool:
        """Whether a renewal fits before the fence at all. An agent refuses a stage whose lease
        is too short for its allowed skew (it would fence itself before its first renewal)."""
        return self.fence_after_sec > self.renew_interval_sec

    @property
    def fence_grace_sec(self) -> float:
        """The SIGTERM grace a fence gives: kill_grace_sec, or what the lease leaves of it."""
        room = self.lease_ttl_sec - self.max_clock_skew_sec - 2 * self.renew_interval_sec
        return max(0.0, min(self.kill_grace_sec, room))

    @property
    def fence_margin_sec(self) -> float:
        return self.fence_grace_sec + self.max_clock_skew_sec

    @property
    def fence_after_sec(self) -> float:
        """SIGTERM to the group this long after the last successful renewal was sent."""
        return self.lease_ttl_sec - self.fence_margin_sec

    @property
    def kill_after_sec(self) -> float:
        return self.fence_after_sec + self.fence_grace_sec

    @property
    def heartbeat_seconds(self) -> float:
        """AwaitResult's HeartbeatSeconds: the state machine's side of the lease."""
        return self.lease_ttl_sec

    @property
    def successor_claim_after_sec(self) -> float:
        """The earliest the next attempt is claimed: the state machine's heartbeat lapse."""
        return self.heartbeat_seconds

    @property
    def successor_probe_after_sec(self) -> float:
        """The earliest the successor probes or re-runs: the recorded lease end plus the skew."""
        return self.lease_ttl_sec + self.max_clock_skew_sec


def shortest_feasible_lease_sec(max_clock_skew_sec: float = MAX_CLOCK_SKEW_SEC) -> int:
    """The shortest whole-second lease an agent allowing this skew takes (see `feasible`)."""
    lease = 1
    while not LeaseTimeline(lease, 0, max_clock_skew_sec).feasible:
        lease += 1
    return lease


def infeasible_lease(lease_ttl_sec: int, max_clock_skew_sec: float = MAX_CLOCK_SKEW_SEC) -> str | None:
    """Why no agent allowing `max_clock_skew_sec` (by default the agents' default) would take a
    stage with this lease, with the arithmetic; None when one would. Whether a renewal fits before
    the fence depends on the lease and the skew only: a kill grace the lease has no room for is
    cut short."""
    timeline = LeaseTimeline(lease_ttl_sec, 0, max_clock_skew_sec)
    if timeline.feasible:
        return None
    default = (
        " (the default max_clock_skew_sec)"
        if max_clock_skew_sec == MAX_CLOCK_SKEW_SEC
        else " (max_clock_skew_sec)"
    )
    every = f"every {round(timeline.renew_interval_sec, 2):g} s (lease/3" + (
        ")" if lease_ttl_sec <= 3 * RENEW_INTERVAL_MAX_SEC else f", at most {RENEW_INTERVAL_MAX_SEC:g} s)"
    )
    return (
        f"a lease of {lease_ttl_sec} s leaves no renewal before the fence: an agent renews {every} and "
        "fences itself "
        f"{max_clock_skew_sec:g} s before the lease ends{default}, at "
        f"{round(timeline.fence_after_sec, 2):g} s; "
        f"no agent with {'the default' if default.startswith(' (the default') else 'that'} allowed skew "
        "would take a stage: "
        f"use {shortest_feasible_lease_sec(max_clock_skew_sec)} s or more"
    )
