"""The job credentials of the attempts this agent holds: granted with each claim, renewed before
they run out (a session lasts an hour at most), resumed after a restart with the claim secret the
journal kept, and let go once the attempt's report is sent or nothing is left to report.

They live in this process only: never written to disk, never in a stage's environment. The
renewal runs on a thread of its own, so no stage, lease or report ever waits for it; a session
that could not be renewed in time simply expires, and what its attempt does next is refused
(the lease keeper's renewals first, so the fence stops the command).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, NamedTuple

from relevo_agent.claim_routes import ClaimRoutes, RouteError, RouteUnreachable, session_credentials
from relevo_agent.reachability import stack as reachability
from relevo_agent.stop import AgentStop
from relevo_core.aws import JobCredentials, call_budget

if TYPE_CHECKING:
    from relevo_core.models.agent_session import JobSession

log = logging.getLogger(__name__)

# A session is renewed once less than this share of its life is left (and at least this long
# before it ends), checked every RENEW_CHECK_SEC.
RENEW_AT_FRACTION = 1 / 3
RENEW_AT_LEAST_SEC = 300.0
RENEW_CHECK_SEC = 10.0
RENEW_CALL_SEC = 10.0


class AttemptKey(NamedTuple):
    """An attempt this agent holds credentials for; two shards of one stage are two attempts."""

    job_id: str
    stage_index: int
    attempt: int
    shard: int | None = None


@dataclass
class _Held:
    credentials: JobCredentials
    claim_secret: str
    granted_at: datetime
    renewing: bool = field(default=False)


def _now() -> datetime:
    return datetime.now(UTC)


class AttemptNotHeld(Exception):
    """The routes will not give this attempt's credentials: another claim holds it, or its job ended."""


class JobSessions:
    def __init__(self, routes: ClaimRoutes | None, agent_id: str, stop: AgentStop | None = None) -> None:
        self.routes = routes
        self.agent_id = agent_id
        self._held: dict[AttemptKey, _Held] = {}
        self._lock = threading.Lock()
        self._stop = stop or AgentStop()
        self._thread: threading.Thread | None = None

    def granted(self, key: AttemptKey, claim_secret: str, session: JobSession) -> JobCredentials:
        """The session a claim came with, kept (and renewed) until `release`."""
        credentials = JobCredentials(session_credentials(session))
        with self._lock:
            self._held[key] = _Held(credentials, claim_secret, _now())
            if self._thread is None:
                self._thread = threading.Thread(target=self._renew_loop, name="job-sessions", daemon=True)
                self._thread.start()
        return credentials

    def for_attempt(self, key: AttemptKey, claim_secret: str | None) -> JobCredentials:
        """The attempt's credentials: the ones held, else asked for again with its claim secret
        (after a restart). AttemptNotHeld when the routes refuse; RouteUnreachable passes on."""
        with self._lock:
            held = self._held.get(key)
        if held is not None:
            return held.credentials
        if not claim_secret or self.routes is None:
            raise AttemptNotHeld(
                f"{key[0]} stage {key[1]} attempt {key[2]}: no claim secret to resume its credentials with"
            )
        session = self._renew(key, claim_secret)
        return self.granted(key, claim_secret, session)

    def release(self, key: AttemptKey) -> None:
        with self._lock:
            self._held.pop(key, None)

    def held(self) -> list[AttemptKey]:
        with self._lock:
            return list(self._held)

    def _renew(self, key: AttemptKey, claim_secret: str) -> JobSession:
        from relevo_core.models.agent_session import SessionRequest

        assert self.routes is not None
        request = SessionRequest(
            job_id=key[0],
            stage_index=key[1],
            shard=getattr(key, "shard", None),
            attempt=key[2],
            agent_id=self.agent_id,
            claim_secret=claim_secret,
        )
        try:
            with call_budget(RENEW_CALL_SEC):
                return self.routes.renew(request)
        except RouteError as refused:
            raise AttemptNotHeld(f"{key[0]} stage {key[1]} attempt {key[2]}: {refused}") from refused

    def _due(self, held: _Held) -> bool:
        expiration = held.credentials.current.expiration
        life = (expiration - held.granted_at).total_seconds()
        left = (expiration - _now()).total_seconds()
        return left < max(RENEW_AT_LEAST_SEC, life * RENEW_AT_FRACTION)

    def renew_due(self) -> None:
        """One round: every held session that is due is renewed (a failure is tried next round)."""
        with self._lock:
            due = [(key, held) for key, held in self._held.items() if self._due(held)]
        for key, held in due:
            try:
                session = self._renew(key, held.claim_secret)
            except AttemptNotHeld as refused:
                log.warning(
                    "job credentials not renewed (%s): the attempt's next calls will be refused", refused
                )
                self.release(key)
                continue
            except RouteUnreachable as exc:
                if not reachability.failed(exc):
                    log.warning(
                        "job credentials of %s stage %d attempt %d not renewed yet (%s)",
                        key[0],
                        key[1],
                        key[2],
                        exc,
                    )
                continue
            held.credentials.replace(session_credentials(session))
            held.granted_at = _now()

    def _renew_loop(self) -> None:
        while not self._stop.wait(RENEW_CHECK_SEC):
            try:
                self.renew_due()
            except Exception:  # noqa: BLE001 - the loop must outlive any one round
                log.exception("job credentials renewal round failed")
