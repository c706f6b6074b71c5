"""Beside each stage, from its claim on, two threads keep the attempt's lease (relevo_agent.lease):
`keep_lease` renews it (and heartbeats the task; a renewal also carries the attempt's upload
progress when a reading is due, relevo_agent.transfer), `keep_fence` stops the command at the
fence whatever the renewals are doing. `keep` starts both, in the caller's job scope.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from botocore.exceptions import BotoCoreError, ClientError

from relevo_agent.attempt import utc_now
from relevo_agent.claim_routes import RouteError, RouteUnreachable
from relevo_agent.reachability import stack as reachability
from relevo_core.aws import call_budget, error_code, in_this_context, own_lane
from relevo_core.fleet.lease_timeline import RETRY_AFTER_FAILURE_SEC
from relevo_core.models.errors import ErrorCode
from relevo_core.models.transfer import TransferProgress
from relevo_core.store import stage_attempts

if TYPE_CHECKING:
    from relevo_agent.attempt import StageRun
    from relevo_agent.stop import AgentStop

log = logging.getLogger(__name__)


def keep(
    run: StageRun, op_id: str, stop: AgentStop, heartbeat: Callable[[StageRun], None]
) -> list[threading.Thread]:
    """The lease keeper and the fence of `run`, started (with the job credentials of this
    thread's scope); both end once `run.done` is set. `heartbeat`: the run's task heartbeat
    (relevo_agent.claim.Claims.heartbeat, through the region's route)."""
    keepers = [
        threading.Thread(
            target=in_this_context(keep_lease), args=(run, op_id, stop, heartbeat), name="lease", daemon=True
        ),
        threading.Thread(target=in_this_context(keep_fence), args=(run, op_id), name="fence", daemon=True),
    ]
    for keeper in keepers:
        keeper.start()
    return keepers


@contextmanager
def _transfer_reading(run: StageRun) -> Iterator[TransferProgress | None]:
    if run.transfer is None:
        yield None
        return
    with run.transfer.riding() as reading:
        yield reading


def keep_lease(run: StageRun, op_id: str, stop: AgentStop, heartbeat: Callable[[StageRun], None]) -> None:
    """Beside the stage, from the claim on: renew the lease, and heartbeat the task (through the
    region's heartbeat route) once the run token was handed, every min(lease/3, 3 s) the lease and every
    lease/3 the task (LeaseTimeline.heartbeat_interval_sec). Each round is bounded by
    the time left before the fence, and only a round that came back extends the lease, from when it was
    sent. The fence itself is not this thread's: `keep_fence` keeps it even while a call hangs.
    `stop`: the agent's; an error that says the stack no longer exists stops it (and the stage)."""
    ref, lease = run.ref, run.lease
    interval = lease.timeline.renew_interval_sec
    # Due one interval after the claim was sent (the lease counts from there), not after
    # this thread happened to start.
    renew_at = lease.deadline - lease.timeline.lease_ttl_sec + interval
    # Failed renewals in a row: the first is said (with the time left before the fence), the
    # retries every RETRY_AFTER_FAILURE_SEC are not, and the first success after them is.
    failed = 0
    # When the task was last heartbeaten (monotonic): every heartbeat_interval_sec, not every renewal.
    beat_sent: float | None = None
    while not run.done.wait(max(0.0, renew_at - time.monotonic())):
        if run.reason is not None or run.reported:
            return  # stopped, or its report ends the lease (`lease_ended`): nothing left to keep
        sent = time.monotonic()
        if lease.fenced(sent):
            return  # too late to renew: keep_fence has stopped the command
        try:
            # Its own clients and connections (own_lane): nothing another thread builds or holds
            # (a log body's S3 client, an outcome's connection) stands in a renewal's way.
            with call_budget(lease.fence_at - sent), own_lane("lease"), _transfer_reading(run) as transfer:
                # An upload's progress rides on the renewal: no write of its own.
                stage_attempts.renew_lease(ref, int(lease.timeline.lease_ttl_sec), utc_now(), transfer)
                if run.run_handed and lease.timeline.heartbeat_due(beat_sent, sent):
                    heartbeat(run)
                    beat_sent = sent
            lease.extend(sent)
            renew_at = sent + interval
            if failed:
                log.info(
                    "%s: lease renewed again after %d failed tr%s",
                    op_id,
                    failed,
                    "y" if failed == 1 else "ies",
                )
                failed = 0
            reachability.answered()
            continue
        except stage_attempts.LeaseLost as lost:
            if run.reported:
                # Its own report landed while this renewal was on its way: the attempt ended here.
                log.info("%s: the attempt's report ended its lease", op_id)
                return
            if lost.ended:
                # Its job ended, or for a shard, a sibling failed for good (fail_fast).
                log.warning(
                    "%s: canceled (its job ended, or a sibling shard failed); stopping the stage", op_id
                )
                run.stop("canceled")
            else:
                log.warning("%s stage %d: lease taken over; stopping the stage", ref.job_id, ref.stage_index)
                run.stop("lease_lost")
            return
        except RouteError as refused:
            if refused.code == ErrorCode.TASK_GONE.value:
                log.warning(
                    "%s stage %d: the execution no longer waits for it; stopping", ref.job_id, ref.stage_index
                )
                run.stop("canceled")
                return
            if refused.canceled:
                # Canceled between this round's renewal and its heartbeat: the ending the renewal
                # would have said (LeaseLost.ended above), not a lost lease.
                log.warning(
                    "%s: canceled (its job ended, or a sibling shard failed); stopping the stage", op_id
                )
                run.stop("canceled")
                return
            if refused.no_longer_held:
                log.warning(
                    "%s stage %d: the heartbeat was refused (%s); stopping the stage",
                    ref.job_id,
                    ref.stage_index,
                    refused.message,
                )
                run.stop("lease_lost")
                return
            why = str(refused)
        except RouteUnreachable as exc:
            why = "no answer" if reachability.failed(exc) else str(exc)
        except ClientError as exc:
            if stop.stack_gone(exc):
                run.stop("shutdown")
                return
            why = error_code(exc)
        except BotoCoreError as exc:
            why = "no answer" if reachability.failed(exc) else str(exc)
        failed += 1
        log.log(
            logging.WARNING if failed == 1 else logging.DEBUG,
            "%s: renewal failed (%s); %.1fs left before the fence, retrying every %gs",
            op_id,
            why,
            lease.fence_in(),
            RETRY_AFTER_FAILURE_SEC,
        )
        renew_at = time.monotonic() + RETRY_AFTER_FAILURE_SEC


def keep_fence(run: StageRun, op_id: str) -> None:
    """At the lease deadline less the fence margin, by this process's monotonic clock, the
    stage's command is stopped and its result withheld, whatever the network is doing. A
    renewal that came back meanwhile has moved the fence; the wait follows it."""
    lease = run.lease
    while not run.done.wait(max(0.01, lease.fence_in())):
        if lease.fenced():
            log.warning(
                "%s attempt %d: no renewal came back in time; fencing (SIGTERM now, SIGKILL after %.1fs)",
                op_id,
                run.ref.attempt,
                lease.grace_sec,
            )
            run.stop("fenced")
            return
