"""The agent's presence record, written on a thread of its own.

Presence: every `presence_interval_sec` (30 s by default), and just after the number of stages it
runs changes (a stage taken: COUNT_SETTLE_SEC after), the agent puts its record (agent id, region, capacity,
running, version, last_seen); when it stops cleanly it marks the record offline. A failed write is logged and
tried again at the next tick: presence never blocks or fails the work.

Pauses: with every write (before it), the agent reads its own pause and its region's dispatch
pause (relevo_agent.pause; two items, one BatchGetItem), and its record then says why it takes
no new stage (`not_claiming`). So a pause takes effect within one presence interval. So does low
disk: the free space under workspace_root is measured before each write, and below
min_free_disk_gb the agent takes no new stage (agent_low_disk) until it is back above.

Where a stage runs (another agent of the region, the previous stage's Mac, one meeting its
`requires`) is decided from these records in relevo_agent.placement.
"""

from __future__ import annotations

import logging
import socket
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from importlib import metadata

from botocore.exceptions import BotoCoreError, ClientError

from relevo_agent.attempt import utc_now
from relevo_agent.config import AgentConfig
from relevo_agent.pause import PauseGate
from relevo_agent.reachability import stack as reachability
from relevo_agent.stop import AgentStop
from relevo_core.models.capabilities import Capabilities
from relevo_core.models.status import QueueReason
from relevo_core.store import agent_pauses, agents
from relevo_core.store.agents import AgentPresence

log = logging.getLogger(__name__)

# A stage taken is written this long after rather than at once: the write (a pause read and a
# put, some milliseconds of this process's CPU each) then does not compete with the claim of the
# stage just taken, on the way to its command (issue 29, the stage handoff). A slot freed is
# written at once: the next stage of a job may be left to this agent because of it.
COUNT_SETTLE_SEC = 0.25


def _version() -> str:
    try:
        return metadata.version("relevo-agent")
    except metadata.PackageNotFoundError:
        return "unknown"


class Presence:
    """The agent's presence writer."""

    def __init__(
        self,
        config: AgentConfig,
        table: str,
        stop: AgentStop,
        clock: Callable[[], datetime] = utc_now,
    ) -> None:
        self.config = config
        self.table = table
        self._stop = stop
        self._clock = clock
        self._version = _version()
        self._running = 0
        # The stage (`<job>:<stage>`) of each shard this agent holds, once a shard.
        self._shard_stages: list[str] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._done = threading.Event()
        self._count_changed = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="presence", daemon=True)
        self.pauses = PauseGate()
        # Detected once at the start (relevo_agent.capabilities); free disk measured at each write.
        self.capabilities: Capabilities | None = None
        # The free-disk probe (GB; injectable), measured before each write.
        self.measure_disk: Callable[[], float | None] = lambda: None
        self._free_disk_gb: float | None = None
        # This process: one relevo-agent per agent_id at a time (see take).
        self.instance_id = uuid.uuid4().hex
        self.host = socket.gethostname()
        self.started_at = clock()

    # ------------------------------------------------------------------ the record
    def take(self, predecessor: str | None = None) -> None:
        """Before anything else: this agent_id's record now names this process. Raises
        AgentIdInUse when another relevo-agent with this agent_id is online (a second launchd
        job, a cloned Mac): starting anyway would have both take work, and a restart's recovery
        fail the other's live stages. `predecessor`: the instance this agent's journal last ran
        as, which a restart takes over without waiting for its record to go stale."""
        agents.take_agent_id(self.table, self._record(), predecessor)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop writing, then mark this agent offline (a clean stop)."""
        self._done.set()
        self._wake.set()
        self._thread.join(timeout=10)
        try:
            agents.mark_offline(
                self.table, self.config.region, self.config.agent_id, self._clock(), self.instance_id
            )
        except (BotoCoreError, ClientError) as exc:
            if not reachability.failed(exc):
                log.warning(
                    "could not mark %s offline; it will look online for a few more intervals",
                    self.config.agent_id,
                )

    @contextmanager
    def occupied(self, shard_of: str | None = None) -> Iterator[int]:
        """A slot is in use for the duration (the record's `running`), written just after it is
        taken (COUNT_SETTLE_SEC) and at once when it is freed. For a shard, `shard_of` is its stage
        (`<job>:<stage>`), listed meanwhile; yields how many shards of that stage this agent held before this
        one (0 for a
        stage without shards)."""
        with self._lock:
            held = self._shard_stages.count(shard_of) if shard_of else 0
            if shard_of:
                self._shard_stages.append(shard_of)
        self._count(+1)
        try:
            yield held
        finally:
            with self._lock:
                if shard_of:
                    self._shard_stages.remove(shard_of)
            self._count(-1)

    def _count(self, delta: int) -> None:
        with self._lock:
            self._running += delta
        if delta > 0:
            # A stage taken: written once its handoff is past. A slot freed is written at once:
            # the region's next stage may be left to this agent (leave_to_previous reads the
            # record), and nothing of this agent competes with the write then.
            self._count_changed.set()
        self._wake.set()

    def _record(self) -> AgentPresence:
        with self._lock:
            running, shard_stages = self._running, tuple(self._shard_stages)
        return AgentPresence(
            agent_id=self.config.agent_id,
            region=self.config.region,
            capacity=self.config.capacity,
            running=running,
            version=self._version,
            last_seen=self._clock(),
            interval_sec=self.config.presence_interval_sec,
            instance_id=self.instance_id,
            host=self.host,
            started_at=self.started_at,
            not_claiming=self.not_claiming(),
            capabilities=self._capabilities(),
            shard_stages=shard_stages,
        )

    def _capabilities(self) -> Capabilities | None:
        if self.capabilities is None:
            return None
        return self.capabilities.model_copy(update={"free_disk_gb": self._free_disk_gb})

    def measure(self) -> None:
        """Free disk as of now (a failed probe keeps the last measure)."""
        try:
            free = self.measure_disk()
        except OSError as exc:
            log.warning("free disk unmeasurable (%s)", exc)
            return
        if free is not None:
            low = free < self.config.min_free_disk_gb
            if low != (self._free_disk_gb is not None and self._free_disk_gb < self.config.min_free_disk_gb):
                log.warning(
                    "free disk %.1f GB is %s min_free_disk_gb %g: %s",
                    free,
                    "below" if low else "back above",
                    self.config.min_free_disk_gb,
                    "taking no new stage" if low else "taking stages again",
                )
            self._free_disk_gb = free

    def not_claiming(self) -> str | None:
        """Why this agent takes no new stage now (a queue reason), or None."""
        paused = self.pauses.reason()
        if paused is not None:
            return paused
        if self._free_disk_gb is not None and self._free_disk_gb < self.config.min_free_disk_gb:
            return QueueReason.AGENT_LOW_DISK.value
        return None

    def write(self) -> None:
        agents.put_presence(self.table, self._record())

    def read_pauses(self) -> None:
        """This agent's pause and its region's, as of now; unreadable: the last read stands."""
        try:
            own, dispatch = agent_pauses.pauses_for_agent(
                self.table, self.config.region, self.config.agent_id
            )
        except (BotoCoreError, ClientError) as exc:
            if not reachability.failed(exc):
                log.warning("pauses unreadable (%s); keeping the last read", exc)
            return
        self.pauses.observe(own, dispatch, self._clock())

    def _loop(self) -> None:
        while not self._done.is_set():
            self._wake.clear()
            self.read_pauses()
            self.measure()
            try:
                self.write()
                reachability.answered()
            except agents.AgentIdInUse as taken:
                # Another process took this agent_id while this one could not write (frozen,
                # cut off for 3 intervals): it is the agent now; this one stops.
                self._stop.ungracefully(f"{taken}: that process is this agent now; exiting")
                return
            except Exception as exc:  # never let presence take the agent down; try again next tick
                if not reachability.failed(exc):
                    log.warning(
                        "presence write failed (%s); retrying in %.0fs",
                        exc,
                        self.config.presence_interval_sec,
                    )
                self._stop.stack_gone(exc)  # a stack that is gone, told from a network fault
            self._wake.wait(self.config.presence_interval_sec)
            if self._count_changed.is_set():
                # A stage just taken: written once its handoff is past, not beside it.
                self._count_changed.clear()
                self._done.wait(COUNT_SETTLE_SEC)
