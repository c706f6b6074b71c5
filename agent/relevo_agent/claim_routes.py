"""The agent's client of the claim routes (relevo_core.fleet.claims), the wire only: the claim of
a stage message its queue handed it, answered with the job as it stands and the job's credentials;
those credentials again, before they run out or after a restart; and the attempt's answers to the
state machine (accept, heartbeat, outcome), which the route sends with tokens the agent never sees. What an
agent claims, when it sends a claim again and what it does with the answer is relevo_agent.claim's.

The requests are signed (SigV4, execute-api) with the agent's own credentials, the only thing
they are still used for besides its queue, presence and pauses; every call is bounded by the
caller's call budget (relevo_core.aws.call_budget), so a claim cannot outlast a lease either.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import urllib3
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest

from relevo_core.aws import SessionCredentials, call_lane, call_time_left, process_credentials
from relevo_core.models.errors import ErrorCode

if TYPE_CHECKING:
    from relevo_core.models.agent_session import (
        AcceptRequest,
        ClaimGranted,
        ClaimRequest,
        HeartbeatRequest,
        JobSession,
        OutcomeReport,
        PlanGranted,
        PlanRequest,
        SessionRequest,
    )

# Without a call budget: connect and read timeouts of one request.
CONNECT_TIMEOUT_SEC = 3.0
READ_TIMEOUT_SEC = 15.0


class RouteError(Exception):
    """The route refused: `status` and the body's stable `code`, and its `details`."""

    def __init__(
        self, status: int, code: str | None, message: str, details: dict[str, Any] | None = None
    ) -> None:
        super().__init__(f"{status} {code or ''}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.details = details or {}

    @property
    def no_longer_held(self) -> bool:
        """The attempt no longer holds its stage: it ended (canceled, fenced on the record) or
        another claim holds it (409 ATTEMPT_ENDED or ATTEMPT_NOT_HELD)."""
        return self.code in (ErrorCode.ATTEMPT_ENDED.value, ErrorCode.ATTEMPT_NOT_HELD.value)

    @property
    def canceled(self) -> bool:
        """The attempt was ended by its job's end or a sibling shard's failure (409 ATTEMPT_ENDED
        with the record's status `canceled`), not by another claim or a lapsed lease: the same
        ending whichever call of the attempt learns it first (a renewal says it as LeaseLost.ended)."""
        return self.code == ErrorCode.ATTEMPT_ENDED.value and self.details.get("status") == "canceled"


class RouteUnreachable(Exception):
    """No answer: the request may or may not have been taken (the caller may send it again)."""


def session_credentials(session: JobSession) -> SessionCredentials:
    return SessionCredentials(
        session.access_key_id, session.secret_access_key, session.session_token, session.expiration
    )


@dataclass
class ClaimRoutes:
    """The claim routes of `region` at the stack's API (`api_url`, e.g. https://…/v1)."""

    api_url: str
    region: str
    aws_region: str
    # What signs each request: the process's own credentials (frozen, refreshed as they near expiry).
    credentials: Callable[[], Any] = field(default=process_credentials)

    def __post_init__(self) -> None:
        # A connection pool per lane (relevo_core.aws.own_lane): the lease keeper's heartbeats and
        # the claims never go over a connection another call (an outcome, a session's renewal)
        # holds or left behind half-closed; with retries off, such a connection would cost a
        # heartbeat its round.
        self._pools: dict[str | None, urllib3.PoolManager] = {}
        self._pools_lock = threading.Lock()

    def _http(self) -> urllib3.PoolManager:
        lane = call_lane()
        found = self._pools.get(lane)
        if found is None:
            with self._pools_lock:
                found = self._pools.setdefault(
                    lane, urllib3.PoolManager(num_pools=2, maxsize=8 if lane is None else 2, retries=False)
                )
        return found

    def claim(self, request: ClaimRequest) -> ClaimGranted:
        from relevo_core.models.agent_session import ClaimGranted

        return ClaimGranted.model_validate(self._post("claims", request.model_dump(mode="json")))

    def renew(self, request: SessionRequest) -> JobSession:
        from relevo_core.models.agent_session import JobSession

        return JobSession.model_validate(self._post("sessions", request.model_dump(mode="json"))["session"])

    # The attempt's answers: the agent holds no task token (relevo_core.fleet.claims). Each raises
    # RouteError with the route's stable code (ATTEMPT_NOT_HELD, ATTEMPT_ENDED, RUN_NOT_HANDED,
    # TASK_GONE) when it is refused, RouteUnreachable when no answer came.
    def accept(self, request: AcceptRequest) -> None:
        self._post("accepts", request.model_dump(mode="json"))

    def heartbeat(self, request: HeartbeatRequest) -> None:
        self._post("heartbeats", request.model_dump(mode="json"))

    def report(self, request: OutcomeReport) -> None:
        self._post("outcomes", request.model_dump(mode="json"))

    def plan(self, request: PlanRequest) -> PlanGranted:
        """The test plan of the sharded stage this claim holds a shard of (relevo_core.fleet.
        test_plans); RouteError TEST_LISTING_DIFFERS when this shard listed other tests."""
        from relevo_core.models.agent_session import PlanGranted

        return PlanGranted.model_validate(self._post("plans", request.model_dump(mode="json")))

    def _post(self, route: str, body: dict[str, Any]) -> dict[str, Any]:
        url = f"{self.api_url.rstrip('/')}/regions/{self.region}/{route}"
        data = json.dumps(body).encode()
        credentials = self.credentials()
        if credentials is None:
            raise RouteError(
                401, "UNAUTHENTICATED", "this agent has no AWS credentials to sign its claim with"
            )
        signed = AWSRequest(
            method="POST",
            url=url,
            data=data,
            headers={"Content-Type": "application/json", "Host": urlsplit(url).netloc},
        )
        SigV4Auth(credentials, "execute-api", self.aws_region).add_auth(signed)
        left = call_time_left()
        if left is not None and left <= 0:
            raise RouteUnreachable(f"POST {url}: no time left in this call's budget")
        connect = CONNECT_TIMEOUT_SEC if left is None else min(CONNECT_TIMEOUT_SEC, max(0.05, left / 4))
        read = READ_TIMEOUT_SEC if left is None else max(0.05, left - connect)
        started = time.monotonic()
        try:
            answer = self._http().request(
                "POST",
                url,
                body=data,
                headers=dict(signed.headers.items()),
                timeout=urllib3.Timeout(connect=connect, read=read),
                redirect=False,
            )
        except urllib3.exceptions.HTTPError as exc:
            raise RouteUnreachable(f"POST {url}: {exc} after {time.monotonic() - started:.2f}s") from exc
        try:
            parsed = json.loads(answer.data or b"null")
        except ValueError:
            parsed = None
        if answer.status == 200 and isinstance(parsed, dict):
            return parsed
        if answer.status >= 500 or answer.status == 429:
            # API Gateway's or Lambda's trouble (throttled, a crash): the claim may have landed.
            raise RouteUnreachable(f"POST {url}: HTTP {answer.status}")
        found = parsed if isinstance(parsed, dict) else {}
        raise RouteError(
            answer.status,
            found.get("error"),
            str(found.get("message") or answer.data[:200]),
            found.get("details"),
        )
