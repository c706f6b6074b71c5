"""Placement: whether this agent takes a stage it received or leaves it to another agent of its
region, decided from the region's presence records (relevo_agent.presence writes them).

Requirements: a stage whose `requires` this agent does not meet (relevo_core.models.capabilities)
is put back on the queue for one that does (Message.resend: a fresh copy, so the passes never
count toward the redrive DLQ): visible again after `handoff_delay_sec` when an online agent of the
region that claims meets them, after `requirement_recheck_sec` when none does (the job's view then
says no_matching_agent). So with no matching agent online, each waiting stage costs one receive,
one presence Query, one send and one delete per recheck interval, whatever the number of agents.

Placement: the dispatch of attempt N > 1 names the agents that ran the failed attempts
(`avoid_agents`). An agent named there does not claim the stage while another agent of the
region, not named, is online (its presence record fresh), whether that agent has a free slot or
not: it makes the message invisible again and lets the other agent take it.
- The other agent has a free slot: the message is visible again after `handoff_delay_sec`, and
  no slot of this agent receives until a second after, so the other agent's poll takes it.
- Every other online agent is busy: the remaining wait (see below) is split into equal hops, one
  per receive still allowed, so this agent receives it at most HANDOFF_MAX_RECEIVES times. During
  a hop it watches the region's presence records (watch_handback): as soon as one shows an agent
  that could take the retry, the message is visible at once, so a retry waits a look for a freed
  slot, not the rest of its hop.
The named agent runs the retry itself only when no other agent is online in the region. Two
safety bounds make it take the stage anyway: the message was sent `handoff_max_wait_sec` ago (at
most half the job's queue timeout), or it has been received HANDOFF_MAX_RECEIVES times. So a retry
never starves behind an agent that stays busy (or died less than 3 presence intervals ago), never
times out in the queue because of the hand-back, and never reaches the work queue's redrive DLQ
(maxReceiveCount 5).

Shards spread: the presence record lists the stage of each shard the agent holds
(`shard_stages`). An agent that already holds a shard of a stage leaves the next one to an online
agent of the region that claims, has a free slot, meets the stage's `requires`, did not fail it
and holds fewer of that stage's shards (the fewest first, then the freest); it starts no receive
until the message is visible again (`handoff_delay_sec`, and a second more), so that agent's poll
takes it. So shards share a Mac only when every other Mac is full or holds as many, and the same
two bounds apply.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime

from botocore.exceptions import BotoCoreError, ClientError

from relevo_agent.attempt import StageMessage, utc_now
from relevo_agent.config import AgentConfig
from relevo_agent.messages import Message
from relevo_agent.stop import AgentStop
from relevo_core.models.capabilities import Capabilities, describe, unmet
from relevo_core.store import agents
from relevo_core.store.agents import AgentPresence

log = logging.getLogger(__name__)

# Below the work queue's maxReceiveCount (5, template.yaml): a message handed back this often is
# taken by whoever receives it next, before SQS would move it to the redrive DLQ.
HANDOFF_MAX_RECEIVES = 3
# A retry handed back while every other agent is busy is watched by the agent that handed it back:
# it reads the region's presence records this often, and makes the message visible at once
# (ChangeMessageVisibility 0) as soon as one shows a slot that could take it (a freed slot is
# written at once: Presence._count). So it waits a look, not the rest of its hop.
HANDBACK_LOOK_SEC = 0.5
# The watch ends this long before the message's invisibility does: after that its receipt handle
# may be refused ("ChangeMessageVisibility", Amazon SQS API Reference: a change or delete after the
# visibility timeout "might result in an error"), and the message is visible anyway.
HANDBACK_MARGIN_SEC = 1.0
# After this agent made a message it passed on visible (or sent it again) it starts no receive for
# this long: the agent it is meant for takes it.
PASSED_ON_QUIET_SEC = 1.5


def waited_enough(waited_sec: float, receive_count: int, max_wait_sec: float) -> bool:
    """The safety bound of every hand-back: a message that waited this long, or was received this
    often, is run where it is rather than starved waiting for a better agent."""
    return waited_sec >= max_wait_sec or receive_count >= HANDOFF_MAX_RECEIVES


def prefer_another(
    agent_id: str,
    avoid_agents: Iterable[str],
    region_agents: Iterable[AgentPresence],
    now: datetime,
    waited_sec: float,
    receive_count: int,
    max_wait_sec: float,
) -> AgentPresence | None:
    """The agent this one should leave the stage to, or None when it should take it itself.

    Any online agent of the region that did not run a failed attempt is preferred, busy or not;
    among them the one with the most free slots."""
    avoid = {name for name in avoid_agents if name}
    if agent_id not in avoid:
        return None
    if waited_enough(waited_sec, receive_count, max_wait_sec):
        return None
    candidates = [
        agent
        for agent in region_agents
        if agent.agent_id != agent_id and agent.agent_id not in avoid and agent.is_online(now)
    ]
    return max(candidates, key=lambda agent: (agent.free, agent.agent_id), default=None)


def spread_to(
    agent_id: str,
    stage: str,
    held_here: int,
    task_requires: dict[str, str],
    avoid_agents: Iterable[str],
    region_agents: Iterable[AgentPresence],
    now: datetime,
    waited_sec: float,
    receive_count: int,
    max_wait_sec: float,
) -> AgentPresence | None:
    """The agent a shard of `stage` (`<job>:<stage>`) should be left to, when this agent holds
    `held_here` shards of it already; None: take it here."""
    if held_here <= 0 or waited_enough(waited_sec, receive_count, max_wait_sec):
        return None
    avoid = set(avoid_agents)
    candidates = [
        agent
        for agent in region_agents
        if agent.agent_id != agent_id
        and agent.agent_id not in avoid
        and agent.is_online(now)
        and agent.not_claiming is None
        and agent.free > 0
        and agent.shards_of(stage) < held_here
        and not unmet(dict(task_requires), agent.capabilities)
    ]
    return min(
        candidates, key=lambda agent: (agent.shards_of(stage), -agent.free, agent.agent_id), default=None
    )


def previous_mac(
    preferred: str | Sequence[str],
    requires: dict[str, str],
    region_agents: Iterable[AgentPresence],
    now: datetime,
    waited_sec: float,
    receive_count: int,
    limit_sec: float,
) -> AgentPresence | None:
    """The first of the `preferred` agents (the one that ran a job's previous stage, then those
    holding its caches: best first) a next stage should be left to: it is online with a free slot,
    takes stages (not paused, not low on disk), meets the stage's `requires`, and the stage has
    waited less than `limit_sec` and been received fewer than HANDOFF_MAX_RECEIVES times. None:
    take the stage here."""
    if limit_sec <= 0 or waited_enough(waited_sec, receive_count, limit_sec):
        return None
    by_id = {agent.agent_id: agent for agent in region_agents}
    for name in [preferred] if isinstance(preferred, str) else preferred:
        agent = by_id.get(name)
        if (
            agent is not None
            and agent.is_online(now)
            and agent.free > 0
            and agent.not_claiming is None
            and not unmet(dict(requires), agent.capabilities)
        ):
            return agent
    return None


def free_for(
    agent_id: str,
    avoid_agents: Iterable[str],
    requires: dict[str, str],
    region_agents: Iterable[AgentPresence],
    now: datetime,
) -> AgentPresence | None:
    """An agent of the region that could take a handed-back retry now: online, taking stages,
    with a free slot, not one that failed it (nor this one), meeting the stage's `requires`."""
    avoid = {name for name in avoid_agents if name} | {agent_id}
    return next(
        (
            agent
            for agent in region_agents
            if agent.agent_id not in avoid
            and agent.is_online(now)
            and agent.not_claiming is None
            and agent.free > 0
            and not unmet(dict(requires), agent.capabilities)
        ),
        None,
    )


def handback_sec(
    other: AgentPresence, waited_sec: float, receive_count: int, max_wait_sec: float, delay_sec: int
) -> int:
    """How long a message handed back to `other` stays invisible (for a `prefer_another` answer).

    A free agent gets it after `delay_sec`. A busy one gets it in equal hops over the rest of the
    wait, one per receive still allowed, so the named agent does not use up its receives (and
    then take the stage itself) long before `max_wait_sec`."""
    if other.free > 0:
        return delay_sec
    hops_left = max(1, HANDOFF_MAX_RECEIVES - receive_count)
    return max(delay_sec, math.ceil((max_wait_sec - waited_sec) / hops_left))


class Placement:
    """Where a stage this agent received runs: here, or left to another agent of the region (a
    retry's, a shard's, a next stage's, one that meets its `requires`)."""

    def __init__(
        self,
        config: AgentConfig,
        table: str,
        stop: AgentStop,
        clock: Callable[[], datetime] = utc_now,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config, self.table, self._stop = config, table, stop
        self._clock, self._monotonic = clock, monotonic
        # Monotonic: no receive of this agent starts before this (a message it passed on is
        # visible for the agent it is meant for; relevo_agent.service reads it).
        self.quiet_until = 0.0
        # The watches of retries handed back to busy agents (watch_handback), while they run.
        self.watches: list[threading.Thread] = []
        self._lock = threading.Lock()
        # This agent's own (relevo_agent.capabilities), detected once at the start.
        self.capabilities: Capabilities | None = None

    def quiet_for(self, seconds: float) -> None:
        """No receive of this agent starts for `seconds` from now."""
        self.quiet_until = max(self.quiet_until, self._monotonic() + seconds)

    def leave_to_another(
        self,
        avoid_agents: Iterable[str],
        queue_timeout_sec: int | None,
        message: Message,
        what: str = "a retry",
        requires: dict[str, str] | None = None,
    ) -> bool:
        """True when the message (`what`: job/stage attempt, for the log) was handed back for
        another agent of the region to take."""
        avoid_agents = tuple(avoid_agents)
        if self.config.agent_id not in avoid_agents:
            return False  # the common case costs nothing
        now = self._clock()
        receive_count = message.receive_count
        region_agents = self._online(now, what)
        if region_agents is None:
            return False
        max_wait_sec = self._max_wait_sec(queue_timeout_sec)
        waited_sec = (now - (message.sent_at or now)).total_seconds()
        other = prefer_another(
            self.config.agent_id, avoid_agents, region_agents, now, waited_sec, receive_count, max_wait_sec
        )
        if other is None:
            return False
        # Received back by a receive of this agent's that was under way when it made the message
        # visible for `other` (its watch, or a pass-on): visible again at once, and no new receive
        # of this agent's competes for a moment, so `other`'s poll takes it.
        at_once = other.free > 0 and self._monotonic() < self.quiet_until
        delay_sec = self.config.handoff_delay_sec
        invisible = 0 if at_once else handback_sec(other, waited_sec, receive_count, max_wait_sec, delay_sec)
        if not self._hide(message, invisible, what):
            return False
        if at_once:
            self.quiet_for(PASSED_ON_QUIET_SEC)
        log.info(
            "left %s to %s (%d free, visible again %s): this agent ran a failed attempt",
            what,
            other.agent_id,
            other.free,
            "now" if at_once else f"in {invisible}s",
        )
        if at_once:
            return True
        if other.free > 0:
            # Keep every slot of this agent (not this one alone: another's poll got it back) off the
            # queue while the message is invisible, so the free agent's poll receives it.
            self.quiet_for(invisible + 1)
            self._stop.wait(invisible + 1)
        else:
            # Every other agent is busy: the hop is long, and this slot stays useful meanwhile. The
            # message is watched instead, and visible again as soon as a slot frees for it.
            watch = threading.Thread(
                target=self.watch_handback,
                args=(message, avoid_agents, requires or {}, invisible, what),
                name="handback",
                daemon=True,
            )
            with self._lock:
                self.watches = [running for running in self.watches if running.is_alive()] + [watch]
            watch.start()
        return True

    def watch_handback(
        self,
        message: Message,
        avoid_agents: Iterable[str],
        requires: dict[str, str],
        invisible_sec: float,
        what: str,
    ) -> bool:
        """While `message` (a retry this agent handed back for `invisible_sec`, every other agent
        busy) is invisible: every HANDBACK_LOOK_SEC, the region's presence records; once one shows
        an agent that could take it, the message is visible at once and this agent stays off the
        queue a moment (PASSED_ON_QUIET_SEC), so that agent's poll takes it. True when it was made
        visible so; False when its hop ended first (it is visible then anyway) or the agent stops
        (it is made visible for the others)."""
        ends = self._monotonic() + invisible_sec - HANDBACK_MARGIN_SEC
        while self._monotonic() + HANDBACK_LOOK_SEC < ends:
            if self._stop.wait(HANDBACK_LOOK_SEC):
                message.give_back_after(0)  # this agent no longer watches: the others look
                return False
            region_agents = self._online(self._clock())
            if region_agents is None:
                continue  # unreadable for a moment: the next look, or the hop's end
            found = free_for(self.config.agent_id, avoid_agents, requires, region_agents, self._clock())
            if found is not None:
                self.quiet_for(PASSED_ON_QUIET_SEC)
                message.give_back_after(0)
                log.info("%s: a slot freed on %s; visible again now", what, found.agent_id)
                return True
        return False

    def leave_to_spread(self, held_here: int, task: StageMessage, message: Message, what: str) -> int | None:
        """Seconds this agent stays off the queue when `what`, a shard of a stage this agent holds
        `held_here` shards of already, was left to an agent holding fewer; None: take it here."""
        if held_here <= 0:
            return None  # the common case costs no read
        now = self._clock()
        region_agents = self._online(now, what)
        if region_agents is None:
            return None
        max_wait_sec = self._max_wait_sec(task.queue_timeout_sec)
        waited_sec = (now - (message.sent_at or now)).total_seconds()
        shard_of = f"{task.job_id}:{task.stage}"
        other = spread_to(
            self.config.agent_id,
            shard_of,
            held_here,
            task.requires,
            task.avoid_agents,
            region_agents,
            now,
            waited_sec,
            message.receive_count,
            max_wait_sec,
        )
        if other is None:
            return None
        invisible_sec = self.config.handoff_delay_sec
        if not self._hide(message, invisible_sec, what):
            return None
        log.info(
            "left %s to %s (%d free, %d of its shards there, %d here; visible again in %ds): "
            "shards spread over the Macs",
            what,
            other.agent_id,
            other.free,
            other.shards_of(shard_of),
            held_here,
            invisible_sec,
        )
        return invisible_sec + 1

    def _online(self, now: datetime, what: str | None = None) -> list[AgentPresence] | None:
        """The region's online agents; None: presence unreadable (said when `what` is taken here)."""
        try:
            return agents.online_agents(self.table, self.config.region, now)
        except (BotoCoreError, ClientError):
            if what is not None:
                log.warning("presence unreadable; taking %s here", what)
            return None

    def _hide(self, message: Message, seconds: int, what: str) -> bool:
        """`message` invisible for `seconds`; False (said) when its receipt is refused."""
        try:
            message.hide_for(seconds)
        except ClientError:
            log.warning("could not hand %s back; taking it here", what)
            return False
        return True

    def _max_wait_sec(self, queue_timeout_sec: int | None) -> float:
        """How long a stage may wait for a better agent: never so long that the hand-back times it
        out in the queue."""
        max_wait_sec: float = self.config.handoff_max_wait_sec
        if queue_timeout_sec:
            max_wait_sec = min(max_wait_sec, queue_timeout_sec / 2)
        return max_wait_sec

    def leave_to_previous(
        self, preferred: str | Sequence[str], requires: dict[str, str], message: Message, what: str
    ) -> bool:
        """True when `what`, a job's next stage, was left to one of the `preferred` agents (best
        first: the Mac that ran its previous stage, then Macs holding its caches; the claim route
        names them only when files or cache entries wait there). Only while that agent waits for
        work (online with a free slot, taking stages, meeting the stage's `requires`: a busy or
        absent Mac is not waited for) and the message was first sent less than
        `prefer_previous_sec` ago; then any agent takes it. The message is sent again at once and
        this agent starts no receive for PASSED_ON_QUIET_SEC: no slot is held."""
        limit = self.config.prefer_previous_sec
        now = self._clock()
        waited_sec = (now - (message.sent_at or now)).total_seconds()
        if limit <= 0 or waited_enough(waited_sec, message.receive_count, limit):
            return False  # the common case after the bound costs no read
        region_agents = self._online(now)
        chosen = region_agents and previous_mac(
            preferred, requires, region_agents, now, waited_sec, message.receive_count, limit
        )
        if not chosen:
            return False
        # Visible again at once, as a fresh copy: a send wakes the long polls waiting on the queue,
        # the chosen Mac's among them, and however many agents pass it on meanwhile, its receive
        # count never nears the redrive DLQ's (Message.resend). This agent stays off the queue a
        # moment, so it is that Mac's poll (or another's that was not offered it yet) that takes it.
        self.quiet_for(PASSED_ON_QUIET_SEC)
        try:
            message.resend(0)
        except (BotoCoreError, ClientError):
            message.give_back()
        log.info("left %s to %s, which waits for work and holds its files or caches", what, chosen.agent_id)
        return True

    def leave_to_matching(self, requires: dict[str, str], message: Message, what: str) -> bool:
        """True when the stage's `requires` are not met here and the message went back on the
        queue for an agent that meets them (or, none being online, for a later look)."""
        missing = unmet(requires, self.capabilities)
        if not missing:
            return False
        region_agents = self._online(self._clock()) or []
        now = self._clock()
        matching = [
            agent.agent_id
            for agent in region_agents
            if agent.agent_id != self.config.agent_id
            and agent.is_online(now)
            and agent.not_claiming is None
            and not unmet(requires, agent.capabilities)
        ]
        delay = self.config.handoff_delay_sec if matching else self.config.requirement_recheck_sec
        try:
            message.resend(delay)
        except (BotoCoreError, ClientError) as exc:
            log.warning("could not put %s back (%s); handing it back instead", what, exc)
            message.give_back()
        has = ", ".join(f"{key} {value or 'none'}" for key, value in missing.items())
        log.info(
            "passed on %s: it requires %s, this agent has %s; %s",
            what,
            describe(requires),
            has,
            f"visible again in {delay}s for {', '.join(matching)}"
            if matching
            else f"no matching agent online; looking again in {delay}s",
        )
        if matching:
            # As for a stage left to the previous stage's Mac: this slot stays off the queue until
            # the message is visible again and a second more, so the matching agent's receive gets
            # it rather than this agent's next one (the emulator's long poll looks again once a
            # second, so the agent that hid the message would otherwise be the first to see it).
            self._stop.wait(delay + 1)
        return True
