"""The local Apple service: App Store Connect's build uploads and builds and the Notary API's
submissions, on loopback for the tests and the demo, keeping state over an injected clock.

Every request first passes the Host check (only this service's loopback names: a page in a
browser cannot reach it by DNS rebinding) and the bearer token (relevo_local.apple.auth). Every
App Store Connect request and answer is then checked against Apple's description
(relevo_local.apple.schema_check), every Notary one against its documented fields; a mismatch is
answered as Apple would refuse it (a request) or as a 500 (an answer of the service's own), and
kept in `mismatches`, which the test's fixture asserts empty: a mismatch fails the test. Answers
from outside the API (a Host refusal, a fault's 504 from the edge, the upload stand-ins) are not
API answers and are not checked."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Awaitable, Callable, MutableMapping
from datetime import datetime
from typing import Any

import uvicorn
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from relevo_local.apple import connect_routes, notary_routes
from relevo_local.apple.auth import ApiKey, Keys, Unauthorized
from relevo_local.apple.clock import ManualClock
from relevo_local.apple.connect_render import error_document
from relevo_local.apple.connect_state import ConnectError, ConnectState, Timing
from relevo_local.apple.description import description
from relevo_local.apple.faults import Faults
from relevo_local.apple.notary import NotaryError, NotaryState
from relevo_local.apple.schema_check import operation, request_problems, response_problems

LOOPBACK = "127.0.0.1"
Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]
UNAUTHORIZED = ConnectError(
    401,
    "NOT_AUTHORIZED",
    "Authentication credentials are missing or invalid.",
    "Provide a properly configured and signed bearer token, and make sure that it has not expired.",
)


class AppleService:
    def __init__(
        self,
        now: Callable[[], datetime] | None = None,
        timing: Timing | None = None,
        review_sec: float | None = None,
    ) -> None:
        description()  # refuses at once, naming the setup step, when the description is not cached
        # The service's time: this clock unless the caller gives its own `now` (the demo's real one).
        self.clock = ManualClock()
        clock_now = now or self.clock.now
        self.connect = ConnectState(clock_now, timing)
        # Apple reviews a submission in minutes; the demo, on the real clock, in seconds.
        self.notary = NotaryState(clock_now) if review_sec is None else NotaryState(clock_now, review_sec)
        self.notary_uploads = notary_routes.NotaryUploads()
        self.keys = Keys(clock_now)
        self.faults = Faults(self.connect, self.notary)
        self.mismatches: list[str] = []
        self.refusals: list[str] = []  # why each token was refused
        self._lock = threading.Lock()
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.bind((LOOPBACK, 0))
        self.port: int = self._socket.getsockname()[1]
        self._hosts = {f"{LOOPBACK}:{self.port}", f"localhost:{self.port}"}
        routes = [
            Route("/v1/{rest:path}", self._connect, methods=["GET", "POST", "PATCH"]),
            Route("/notary/v2/{rest:path}", self._notary, methods=["GET", "POST"]),
            Route("/upload/{file_id}", self._upload_part, methods=["PUT"]),
            Route("/s3/{bucket}/{key:path}", self._notary_object, methods=["PUT"]),
            Route("/notary-logs/{submission_id}", self._notary_log, methods=["GET"]),
        ]
        self._app = Starlette(routes=routes)
        config = uvicorn.Config(
            self._asgi,
            interface="asgi3",
            http="h11",
            proxy_headers=False,
            log_level="warning",
            access_log=False,
            lifespan="off",
        )
        self._server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def answer_as(self, port: int) -> None:
        """Answer requests addressed to another loopback port too: a proxy's on this host that
        forwards to this service (the drill's fault proxy between an agent and Apple)."""
        self._hosts |= {f"{LOOPBACK}:{port}", f"localhost:{port}"}

    def add_key(self, key: ApiKey) -> None:
        self.keys.add(key)

    def take_mismatches(self) -> list[str]:
        with self._lock:
            taken, self.mismatches = self.mismatches, []
            return taken

    async def _asgi(
        self, scope: Scope, receive: Callable[[], Awaitable[Any]], send: Callable[[Any], Awaitable[None]]
    ) -> None:  # noqa: E501
        if scope["type"] != "http":
            return
        host = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
        if host not in self._hosts:
            await PlainTextResponse(f"Host {host!r} is not this service", status_code=421)(
                scope, receive, send
            )
            return
        outcome: dict[str, bool] = {"lose": False}
        scope["relevo.outcome"] = outcome

        async def answer_or_drop(message: Any) -> None:
            if outcome["lose"]:
                return
            await send(message)

        await self._app(scope, receive, answer_or_drop)
        if outcome["lose"]:
            # The effect took place; the answer is lost: the connection closes with nothing sent.
            # uvicorn's request cycle holds the transport (uvicorn is pinned in the lock).
            cycle = getattr(receive, "__self__", None)
            transport = getattr(cycle, "transport", None)
            if transport is None:
                raise RuntimeError("uvicorn's request cycle has no transport: cannot drop the answer")
            cycle.disconnected = True  # type: ignore[union-attr]  # nothing more is sent on it
            transport.close()

    def _mismatch(self, text: str) -> None:
        with self._lock:
            self.mismatches.append(text)

    def _authorized(self, request: Request) -> bool:
        try:
            self.keys.check(request.headers.get("authorization"))
        except Unauthorized as refusal:
            self.refusals.append(str(refusal))
            return False
        return True

    def _after_commit(self, request: Request, name: str, status: int) -> Response | None:
        if status >= 300:
            return None
        self.faults.run_hook(name)
        fault = self.faults.take(name)
        if fault == "lose_answer":
            request.scope["relevo.outcome"]["lose"] = True
            return Response(status_code=204)
        if fault == "gateway_timeout":
            return PlainTextResponse("504 Gateway Time-out", status_code=504)
        return None

    async def _connect(self, request: Request) -> Response:
        method, path = request.method, request.url.path
        raw = await request.body()
        query = dict(request.query_params)
        try:
            body = json.loads(raw) if raw else None
            name = operation(method, path).operation_id
        except (ValueError, LookupError) as error:
            self._mismatch(f"{method} {path}: {error}")
            return self._connect_answer(
                method, path, ConnectError(400, "PARAMETER_ERROR.INVALID", "Bad request", str(error))
            )  # noqa: E501
        if not self._authorized(request):
            return self._connect_answer(method, path, UNAUTHORIZED)
        problems = request_problems(method, path, query, body)
        if problems:
            self._mismatch(f"{method} {path} ({name}) request: " + "; ".join(problems))
            status = 409 if body is not None else 400
            code = "ENTITY_ERROR.ATTRIBUTE.INVALID" if status == 409 else "PARAMETER_ERROR.INVALID"
            return self._connect_answer(
                method,
                path,
                ConnectError(status, code, "The request does not match the API", "; ".join(problems)),
            )  # noqa: E501
        call = connect_routes.Call(self.url, path, (), query, body)
        try:
            status, document = connect_routes.answer(self.connect, method, call)
        except ConnectError as refusal:
            return self._connect_answer(method, path, refusal)
        return self._after_commit(request, name, status) or self._connect_answer(
            method, path, (status, document)
        )

    def _connect_answer(
        self, method: str, path: str, answer: ConnectError | tuple[int, dict[str, Any]]
    ) -> Response:
        status, document = (
            (answer.status, error_document(answer)) if isinstance(answer, ConnectError) else answer
        )
        try:
            problems = response_problems(method, path, status, document)
        except LookupError:
            problems = []  # a path of no operation: the 404 / 400 above is the answer
        if problems:
            self._mismatch(f"{method} {path} answer {status}: " + "; ".join(problems))
            return PlainTextResponse(
                "the local Apple service's answer does not match Apple's description", 500
            )
        return JSONResponse(document, status_code=status)

    async def _notary(self, request: Request) -> Response:
        method, path = request.method, request.url.path
        raw = await request.body()
        if not self._authorized(request):
            return JSONResponse(error_document(UNAUTHORIZED), status_code=401)
        name = notary_routes.operation_of(method, path)
        try:
            body = json.loads(raw) if raw else None
            status, model = notary_routes.answer(
                self.notary, self.notary_uploads, self.url, method, path, body
            )
        except ValidationError as error:
            self._mismatch(
                f"{method} {path} ({name}) request: " + "; ".join(notary_routes.problems_of(error))
            )
            return JSONResponse(notary_routes.error_document(400, str(error)), status_code=400)
        except ValueError as error:
            self._mismatch(f"{method} {path} ({name}) request: {error}")
            return JSONResponse(notary_routes.error_document(400, str(error)), status_code=400)
        except NotaryError as refusal:
            return JSONResponse(notary_routes.error_document(refusal.status, refusal.detail), refusal.status)
        document = model.model_dump(mode="json", exclude_none=True)
        try:
            type(model).model_validate(document)  # the answer as sent, read back by its documented model
        except ValidationError as error:
            self._mismatch(f"{method} {path} answer: {error}")
            return PlainTextResponse("the local Apple service's answer does not match the Notary API", 500)
        return self._after_commit(request, name, status) or JSONResponse(document, status_code=status)

    async def _upload_part(self, request: Request) -> Response:
        try:
            offset = int(request.query_params.get("offset", "0"))
            self.connect.receive_part(request.path_params["file_id"], offset, await request.body())
        except (ConnectError, ValueError) as refusal:
            return PlainTextResponse(str(refusal), status_code=getattr(refusal, "status", 400))
        return Response(status_code=200, headers={"ETag": f'"{request.path_params["file_id"]}-{offset}"'})

    async def _notary_object(self, request: Request) -> Response:
        key = request.path_params["key"]
        token = self.notary_uploads.tokens.get(key)
        if token is None or request.headers.get("x-amz-security-token") != token:
            return PlainTextResponse("AccessDenied", status_code=403)
        self.notary.receive(self.notary_uploads.objects[key], await request.body())
        return Response(status_code=200)

    async def _notary_log(self, request: Request) -> Response:
        try:
            submission = self.notary.get(request.path_params["submission_id"])
        except NotaryError as refusal:
            return PlainTextResponse(refusal.detail, status_code=404)
        return JSONResponse(self.notary.log(submission))

    def start(self, timeout: float = 15) -> AppleService:
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._socket]},
                                        name="local-apple", daemon=True)  # fmt: skip
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the local Apple service did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._socket.close()

    def __enter__(self) -> AppleService:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()
