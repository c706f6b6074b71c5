"""The agent's supervisor: it takes this agent's identity, recovers what a previous run left
(relevo_agent.restart), then starts the poll and the outbox loops and watches for signals, a
stack that went away and an agent_id taken over. The poll takes a message while there is free
capacity and dispatches it to a thread of its own, which leaves a retry to another agent
(relevo_agent.placement) or runs the stage (relevo_agent.stage).

Stopping is one AgentStop (relevo_agent.stop) that every loop holds; capacity is Slots
(relevo_agent.slots).

The lease is a deadline on this process's monotonic clock (relevo_agent.lease): every call the
lease path makes is bounded by the time left before it (relevo_core.aws.call_budget), and the
fence comes from its own thread, so no network call can hold it back. A frozen agent's command
is killed by its supervisor, a process of its own.

Pause and drain (relevo_agent.pause, read with presence): a paused agent stops receiving and lets
its running stages finish, their leases kept; a message received just before the pause was seen
is handed straight back (visible at once) for another agent. A drained agent then exits 0 once no
stage runs, as after a first signal.

Shutdown (the signal handler only counts signals): 1st stop taking work and let running stages
finish; 2nd cancel them (group SIGTERM, then SIGKILL) and report Relevo.Transient.AgentShutdown;
3rd exit at once (each stage's supervisor still kills its process group).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError
from pydantic import ValidationError

from relevo_agent import capabilities, messages, restart
from relevo_agent.attempt import HandBack, utc_now
from relevo_agent.claim_routes import ClaimRoutes
from relevo_agent.config import AgentConfig
from relevo_agent.job_sessions import JobSessions
from relevo_agent.journal import Journal
from relevo_agent.messages import Message
from relevo_agent.outbox import Outbox
from relevo_agent.placement import Placement
from relevo_agent.presence import Presence
from relevo_agent.reachability import stack as reachability
from relevo_agent.reachability import stack_words
from relevo_agent.slots import Slots
from relevo_agent.stage import StageRunner
from relevo_agent.stop import AgentStop
from relevo_core.aws import aws_region
from relevo_core.models.stage_message import StageMessage
from relevo_core.store.agents import AgentIdInUse

log = logging.getLogger(__name__)

# The journal's record of the instance this agent last ran as (see Presence.take).
INSTANCE_KEY = "instance_id"

# Exit statuses of `relevo-agent run` besides 0 (a clean stop) and 130 (the third signal).
EXIT_AGENT_ID_IN_USE = 2
EXIT_STACK_GONE = 3
STACK_FILE_CHECK_SEC = 5.0
FATAL_STOP_WAIT_SEC = 10.0


class Agent:
    def __init__(
        self,
        config: AgentConfig,
        table_name: str,
        queue_url: str,
        journal: Journal | None = None,
        api_url: str | None = None,
        follow_stack: bool = False,
    ) -> None:
        self.config = config
        # `relevo local agent`: a stack file naming another stack (the local stack restarted) is
        # not a reason to stop; the caller starts again against it (relevo_agent.launch run_agent).
        self.follow_stack = follow_stack
        self.table_name = table_name
        self.queue_url = queue_url
        self.journal = journal or Journal(config.journal)
        # Set by the signal handler, read by the supervisor loop: 1 drain, 2 cancel, 3 exit.
        self.signals = 0
        # The name of the last signal counted (SIGINT: Ctrl-C in the agent's terminal).
        self.signal_name = "SIGTERM"
        # Why and how this agent stops, held by every loop of it (its stack gone, its agent_id taken, a
        # signal).
        self.stop = AgentStop(table_name, queue_url, follow_stack)
        self.slots = Slots(config.capacity)
        # The job credentials of the attempts it holds, from the claim routes of its region.
        routes = ClaimRoutes(api_url, config.region, aws_region()) if api_url else None
        self.sessions = JobSessions(routes, config.agent_id, self.stop)
        self.outbox = Outbox(self.journal, table_name, config.agent_id, self.stop, self.sessions)
        self.presence = Presence(config, table_name, self.stop)
        self.placement = Placement(config, table_name, self.stop)
        self.stages = StageRunner(
            config,
            table_name,
            self.journal,
            self.outbox,
            self.stop,
            self.sessions,
            # An agent that never waits for a better Mac asks the claim route for none (a refusal
            # would cost a round trip, and for a cache's stage a read of its holders).
            prefer_previous=self.placement.leave_to_previous if config.prefer_previous_sec > 0 else None,
        )

    # ------------------------------------------------------------------ the stack
    def stack_identity(self) -> dict[str, str | None]:
        """The stack this agent runs against: its endpoint (None: AWS's), table and work queue."""
        return {
            "endpoint": os.environ.get("AWS_ENDPOINT_URL"),
            "table": self.table_name,
            "queue": self.queue_url,
        }

    def _stack_file_changed(self, seen: dict[str, Any]) -> None:
        """A stack file that now names another stack (the local stack restarted: new table, new
        ports): exit, so that the restart runs against the stack it names."""
        path = self.config.stack_file
        if path is None:
            return
        try:
            stat = path.stat().st_mtime_ns
            if seen.setdefault("mtime", stat) == stat:
                return
            seen["mtime"] = stat
            from relevo_core.files.stack import load_stack

            stack = load_stack(path)
        except (OSError, ValueError):
            return  # being rewritten, or gone for a moment: look again next time
        now = {
            "endpoint": stack.aws_endpoint,
            "table": stack.table_name,
            "queue": stack.work_queues.get(self.config.region),
        }
        was = self.stack_identity()
        changed = [f"{name} {was[name]} -> {now[name]}" for name in now if now[name] != was[name]]
        if changed:
            then = (
                ": starting again against it" if self.follow_stack else "; exiting so that a restart uses it"
            )
            self.stop.ungracefully(
                f"the stack file {path} names another stack ({'; '.join(changed)}){then}", stack_moved=True
            )

    # ------------------------------------------------------------------ loops
    def run(self) -> int:
        """Supervise until shut down; returns the process exit status: 0 after a clean stop,
        EXIT_AGENT_ID_IN_USE when another process runs with this agent_id, EXIT_STACK_GONE when
        the stack went away or this agent_id was taken over, 130 at the third signal."""
        detected = capabilities.detect(self.config.workspace_root, self.config.labels)
        self.presence.capabilities = self.placement.capabilities = detected
        self.stages.command.capabilities = detected  # a cache key's facts (relevo_agent.caches)
        self.presence.measure_disk = lambda: capabilities.free_disk_gb(self.config.workspace_root)
        self.presence.measure()
        try:
            self.presence.take(predecessor=self.journal.recall(INSTANCE_KEY))
            self.journal.remember(INSTANCE_KEY, self.presence.instance_id)
            restart.recover(self.journal, self.outbox)
            # Signing keychains a crash of an earlier run left (relevo_agent.keychain), before any stage.
            self.stages.keychains.sweep()
        except AgentIdInUse as other:
            log.error("%s; not starting: stop it, or give this agent an agent_id of its own", other)
            return EXIT_AGENT_ID_IN_USE
        except (BotoCoreError, ClientError) as exc:
            if not self.stop.stack_gone(exc):
                raise
            log.error("%s", self.stop.fatal)
            return EXIT_STACK_GONE
        self.journal.remember("stack", json.dumps({**self.stack_identity(), "at": utc_now().isoformat()}))
        poller = threading.Thread(target=self._poll, name="poll", daemon=True)
        flusher = threading.Thread(
            target=self.outbox.run_forever,
            args=(self.config.outbox_interval_sec,),
            name="outbox",
            daemon=True,
        )
        poller.start()
        flusher.start()
        canceled = False
        stack_file: dict[str, Any] = {}
        self._stack_file_changed(stack_file)  # notes the file as it is at the start
        checked = time.monotonic()
        while True:
            if self.stop.fatal is not None:
                return self._exit_fatal()
            if time.monotonic() - checked >= STACK_FILE_CHECK_SEC:
                checked = time.monotonic()
                self._stack_file_changed(stack_file)
            if self.signals >= 3:
                log.warning("third signal: exiting now; the supervisors kill the running stages")
                return 130
            if self.signals >= 1 and not self.stop.is_set():
                what = "Ctrl-C" if self.signal_name == "SIGINT" else self.signal_name
                if self.slots.running:
                    log.warning(
                        "%s: taking no new stage; waiting for %d running stage(s) to finish (%s again "
                        "cancels them, "
                        "a third time exits at once)",
                        what,
                        self.slots.running,
                        what,
                    )
                else:
                    log.info(
                        "%s: no stage runs; stopping once the work queue's long poll returns (at most %ds)",
                        what,
                        self.config.poll_wait_sec,
                    )
                self.stop.gracefully()
            if not self.stop.is_set() and self.presence.pauses.drain_requested() and self.slots.idle():
                log.info("drained: no stage runs; exiting")
                self.stop.gracefully()
            if self.signals >= 2 and not canceled:
                canceled = True
                log.warning("second signal: canceling running stages")
                self.stages.stop_all("shutdown")
            if self.stop.is_set() and self.slots.idle() and not poller.is_alive():
                self.outbox.flush()
                self.presence.stop()  # marks this agent offline: retries stop waiting for it
                log.info("agent %s stopped", self.config.agent_id)
                return 0
            time.sleep(0.1)

    def _exit_fatal(self) -> int:
        """One line says why; the running stages are stopped (their groups killed) first. A stack
        that moved, for an agent that follows its stack file, is no error: it starts again."""
        log.log(
            logging.INFO if self.follow_stack and self.stop.stack_moved else logging.ERROR,
            "%s",
            self.stop.fatal,
        )
        self.stages.stop_all("shutdown")
        deadline = time.monotonic() + FATAL_STOP_WAIT_SEC
        while not self.slots.idle() and time.monotonic() < deadline:
            time.sleep(0.1)
        # The poll and presence loops end too: nothing of this agent outlives its exit (in a
        # process that lives on, such as a test's, they would go on polling and writing).
        self.stop.gracefully()
        self.presence.stop()
        return EXIT_STACK_GONE

    def _poll(self) -> None:
        # The region affinity is the fleet's own name for a set of Macs; its work queue lives in
        # the stack's AWS region (or the local stack), whatever the queue's URL says.
        log.info(
            "agent %s (capacity %d) polling the work queue of region affinity %s (%s) on %s",
            self.config.agent_id,
            self.config.capacity,
            self.config.region,
            self.queue_url.rstrip("/").rsplit("/", 1)[-1],
            stack_words(),
        )
        self.presence.start()
        paused_by: str | None = None
        while not self.stop.is_set():
            if not self.presence.pauses.has_read():
                # Nothing is taken before this instance knows its pauses: launchd restarting a
                # drained or paused agent must not claim a stage in the moment before its first read.
                self.presence.read_pauses()
                if not self.presence.pauses.has_read():
                    self.stop.wait(1)
                    continue
            if self.slots.idle():
                self.stages.admission.hygiene.between_stages()  # no stage runs, and none starts meanwhile
            pause = self.presence.pauses.blocking()
            if pause is not None:
                if paused_by != pause.pause_id:
                    paused_by = pause.pause_id
                    what = (
                        "region dispatch" if pause.agent_id is None else ("drain" if pause.drain else "pause")
                    )
                    log.info(
                        "%s until %s (%s): taking no new stage",
                        what,
                        pause.until.isoformat(timespec="seconds"),
                        pause.note or "no note",
                    )
                self.stop.wait(0.5)
                continue
            if paused_by is not None:
                paused_by = None
                log.info("pause ended: taking stages again")
            if self.presence.not_claiming() is not None:  # low disk (said in presence and logged there)
                self.stop.wait(0.5)
                continue
            # A message this agent passed on (a shard spread, a retry or a next stage left to
            # another Mac) is that agent's to receive: no receive of this one competes meanwhile.
            quiet = self.placement.quiet_until - time.monotonic()
            if quiet > 0:
                self.stop.wait(min(quiet, 0.5))
                continue
            if not self.slots.hold(timeout=0.5):
                continue  # no free capacity: do not take work we cannot start
            try:
                received = messages.receive(self.queue_url, self.config.poll_wait_sec)
            except (ClientError, BotoCoreError) as exc:
                self.slots.release()
                if self.stop.stack_gone(exc):
                    return
                if not reachability.failed(exc):
                    log.warning("receive failed (%s); retrying", exc)
                self.stop.wait(1)
                continue
            reachability.answered()
            if not received:
                self.slots.release()
                continue
            if self.stop.is_set():
                # Taken during the drain: hand it straight back to the other agents.
                received[0].give_back()
                self.slots.release()
                return
            if self.presence.not_claiming() is not None:
                received[0].give_back()  # paused (or low on disk) during the long poll: not this agent's now
                self.slots.release()
                continue
            self.slots.started()
            threading.Thread(target=self._handle, args=(received[0],), name="stage", daemon=True).start()

    # ------------------------------------------------------------------ dispatch
    def _handle(self, message: Message) -> None:
        """One received message, on a thread of its own, which ends its slot (Slots.started)."""
        try:
            task = StageMessage.model_validate_json(message.body)
        except ValidationError:
            log.error("unreadable stage message %s: left for the queue's redrive DLQ", message.message_id)
            self.slots.ended()
            return
        what = f"{task.job_id}/{task.stage} attempt {task.attempt}"
        try:
            if task.requires and self.placement.leave_to_matching(task.requires, message, what):
                return
            if self.placement.leave_to_another(
                task.avoid_agents, task.queue_timeout_sec, message, what, task.requires
            ):
                return
            if task.shard is not None:
                what = f"{what} shard {task.shard}"
            left_for = None
            with self.presence.occupied(
                None if task.shard is None else f"{task.job_id}:{task.stage}"
            ) as held_here:
                left_for = self.placement.leave_to_spread(held_here, task, message, what)
                if left_for is None:
                    self.stages.run(task, message)
            if left_for is not None:
                # No receive of this agent's starts while the shard is invisible and just after, so
                # the other agent's poll receives it (a receive under way may still: it is decided again).
                self.placement.quiet_for(left_for)
        except HandBack as why:
            if self.stop.stack_gone(why.__cause__):
                return
            log.warning("%s: %s; handing the message back", what, why)
            message.give_back()
        except Exception:
            log.exception("stage %s crashed in the agent; handing the message back", what)
            message.give_back()
        finally:
            self.slots.ended()
