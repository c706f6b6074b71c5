"""The local stand-in for API Gateway: routes each `Api` event of the template to its function
with the REST API proxy event AWS would send (raw body, headers, path parameters, and for IAM
routes the identity of the access key whose SigV4 signature was verified)."""

from __future__ import annotations

import base64
import json
import re
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from relevo_local.sigv4 import Refusal

MAX_PAYLOAD = 10 * 1024 * 1024  # API Gateway's own payload limit
# Connections the kernel queues before the server accepts them. socketserver's default of 5 reset
# most of a burst of concurrent deliveries; API Gateway answers every request within its burst
# limit (5,000 by default, "Throttle requests to your REST APIs"), so the queue is as deep as the
# kernel allows (net.core.somaxconn caps it).
LISTEN_BACKLOG = 4096


class _Server(ThreadingHTTPServer):
    request_queue_size = LISTEN_BACKLOG


@dataclass(frozen=True)
class Route:
    method: str
    path: str  # the template's path, e.g. /webhooks/github/{project_id}
    iam: bool
    function: str
    pattern: re.Pattern[str]

    @classmethod
    def of(cls, method: str, path: str, iam: bool, function: str) -> Route:
        regex = re.sub(r"\\\{(\w+)\\\}", r"(?P<\1>[^/]+)", re.escape(path))
        return cls(method, path, iam, function, re.compile(f"^{regex}$"))


class ApiAdapter:
    def __init__(
        self,
        routes: list[Route],
        invoke: Callable[[str, dict[str, Any]], Any],
        authenticate: Callable[[str, str, dict[str, str], bytes], dict[str, str] | Refusal],
        stage: str,
        api_id: str,
        account_id: str,
        host: str = "127.0.0.1",
        port: int = 0,
        gateway_responses: dict[str, tuple[int | None, str]] | None = None,
    ) -> None:
        self.routes = routes
        # GatewayResponses of the template: type → (status or None for the default, body template).
        self.gateway_responses = gateway_responses or {}
        self.invoke = invoke
        # (method, url as signed, headers, body) -> the signer's identity, or API Gateway's refusal.
        self.authenticate = authenticate
        self.stage = stage
        self.api_id = api_id
        self.account_id = account_id
        adapter = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # quiet: the functions log
                return

            def _serve(self) -> None:
                status, headers, body = adapter.handle(
                    self.command,
                    self.path,
                    dict(self.headers.items()),
                    self._read_body(),
                    self.client_address[0],
                )
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the caller gave up waiting; nothing to tell it

            def _read_body(self) -> bytes:
                length = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(length) if length else b""

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _serve

            def __getattr__(self, name: str) -> Any:
                # Any other method (TRACE, CONNECT, made-up ones) gets API Gateway's answer too.
                if name.startswith("do_"):
                    return self._serve
                raise AttributeError(name)

        self.server = _Server((host, port), Handler)
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        assert isinstance(host, str)  # an AF_INET server's address: bytes only for AF_UNIX
        return f"http://{host}:{port}/{self.stage}"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def handle(
        self, method: str, raw_path: str, headers: dict[str, str], body: bytes, source_ip: str
    ) -> tuple[int, dict[str, str], bytes]:
        url = urlsplit(raw_path)
        prefix = f"/{self.stage}"
        if not (url.path == prefix or url.path.startswith(prefix + "/")):
            return self._gateway_response("MISSING_AUTHENTICATION_TOKEN", 403, "Missing Authentication Token")
        path = url.path[len(prefix) :] or "/"
        if len(body) > MAX_PAYLOAD:
            return self._gateway_response("REQUEST_TOO_LARGE", 413, "Request Too Long")
        for route in self.routes:
            match = route.pattern.match(path)
            if not match or route.method != method:
                continue
            identity = {"sourceIp": source_ip, "userAgent": headers.get("User-Agent", "")}
            if route.iam:
                host = next((v for k, v in headers.items() if k.lower() == "host"), "")
                signer = self.authenticate(method, f"http://{host}{raw_path}", headers, body)
                if isinstance(signer, Refusal):
                    # What API Gateway answers (403) when it cannot authenticate the request;
                    # the function is never called.
                    return self._gateway_response(signer.response_type, 403, signer.message)
                identity.update(signer)
            event = self._event(route, method, path, url.query, headers, body, match.groupdict(), identity)
            try:
                response = self.invoke(route.function, event)
            except Exception as exc:  # a crashed function is API Gateway's 502, logged like Lambda's
                sys.stderr.write(f"{method} {path} -> 502: {exc}\n")
                return self._gateway_response("DEFAULT_5XX", 502, "Internal server error")
            if not isinstance(response, dict) or "statusCode" not in response:
                return self._gateway_response("DEFAULT_5XX", 502, "Internal server error")
            return _proxy_response(response)
        return self._gateway_response("MISSING_AUTHENTICATION_TOKEN", 403, "Missing Authentication Token")

    def _gateway_response(
        self, response_type: str, status: int, message: str
    ) -> tuple[int, dict[str, str], bytes]:
        """API Gateway's own refusal, shaped by the template's GatewayResponses: the type's entry,
        else DEFAULT_4XX / DEFAULT_5XX by status, else API Gateway's bare `{"message": ...}`."""
        default = "DEFAULT_5XX" if status >= 500 else "DEFAULT_4XX"
        configured = self.gateway_responses.get(response_type) or self.gateway_responses.get(default)
        if configured is None:
            return _gateway_error(status, message)
        configured_status, body_template = configured
        context = {
            "error.message": message,
            "error.messageString": json.dumps(message),
            "error.responseType": response_type,
            "requestId": str(uuid.uuid4()),
            "apiId": self.api_id,
            "accountId": self.account_id,
            "stage": self.stage,
        }
        headers = {"Content-Type": "application/json", "x-amzn-ErrorType": "GatewayError"}
        return configured_status or status, headers, render_gateway_response(body_template, context).encode()

    def _event(
        self,
        route: Route,
        method: str,
        path: str,
        query: str,
        headers: dict[str, str],
        body: bytes,
        path_parameters: dict[str, str],
        identity: dict[str, str],
    ) -> dict[str, Any]:
        multi_query = parse_qs(query, keep_blank_values=True)
        try:
            text, is_base64 = body.decode("utf-8"), False
        except UnicodeDecodeError:
            text, is_base64 = base64.b64encode(body).decode(), True
        multi_headers: dict[str, list[str]] = {}
        for name, value in headers.items():
            multi_headers.setdefault(name, []).append(value)
        now = time.time()
        return {
            "resource": route.path,
            "path": path,
            "httpMethod": method,
            "headers": headers or None,
            "multiValueHeaders": multi_headers or None,
            "queryStringParameters": {k: v[-1] for k, v in multi_query.items()} or None,
            "multiValueQueryStringParameters": multi_query or None,
            "pathParameters": path_parameters or None,
            "stageVariables": None,
            "requestContext": {
                "resourcePath": route.path,
                "httpMethod": method,
                "path": f"/{self.stage}{path}",
                "stage": self.stage,
                "accountId": self.account_id,
                "apiId": self.api_id,
                "protocol": "HTTP/1.1",
                "requestId": str(uuid.uuid4()),
                "requestTimeEpoch": int(now * 1000),
                "requestTime": time.strftime("%d/%b/%Y:%H:%M:%S +0000", time.gmtime(now)),
                "identity": identity,
            },
            "body": text if body else None,
            "isBase64Encoded": is_base64,
        }


_CONTEXT_VARIABLE = re.compile(r"\$context\.([A-Za-z][A-Za-z0-9_.]*[A-Za-z0-9_])")


def render_gateway_response(body_template: str, context: dict[str, str]) -> str:
    """A gateway response body as API Gateway renders it: simple `$context.name` substitution, no
    VTL. AWS ("Variables for data transformations for API Gateway") documents
    `$context.error.messageString` as the quoted value of `$context.error.message`, so it is
    substituted as a JSON string, quotes included, and a template writes it bare. A variable not in
    `context` is left as written, for the tests to notice."""
    return _CONTEXT_VARIABLE.sub(lambda found: context.get(found.group(1), found.group(0)), body_template)


def _gateway_error(status: int, message: str) -> tuple[int, dict[str, str], bytes]:
    return (
        status,
        {"Content-Type": "application/json", "x-amzn-ErrorType": "GatewayError"},
        json.dumps({"message": message}).encode(),
    )


def _proxy_response(response: Any) -> tuple[int, dict[str, str], bytes]:
    if not isinstance(response, dict) or "statusCode" not in response:
        return _gateway_error(502, "Internal server error")
    headers = {k: str(v) for k, v in (response.get("headers") or {}).items()}
    for name, values in (response.get("multiValueHeaders") or {}).items():
        headers[name] = ", ".join(str(v) for v in values)
    body = response.get("body") or ""
    data = base64.b64decode(body) if response.get("isBase64Encoded") else str(body).encode()
    return int(response["statusCode"]), headers, data
