"""What keeps a console on loopback the operator's own (issue 18, point 7).

Any web page the operator's browser opens can send requests to 127.0.0.1, and a DNS name an
attacker controls can be made to resolve to it (DNS rebinding). So, on every request:

- `Host` must name this server (127.0.0.1 or localhost): Starlette's TrustedHostMiddleware, which
  refuses a rebound name with 400 before anything else runs;
- `Origin`, when the browser sends one, must be this server's own; a request that changes
  something (any method but GET/HEAD) must carry it (or, failing that, a same-origin `Referer`),
  and `Sec-Fetch-Site: cross-site` is refused outright. A page on another port of 127.0.0.1 is
  *same-site* for SameSite cookies, so the origin check is what stops its POST;
- the session cookie: the random token in the URL `relevo console` prints is exchanged for an
  HttpOnly, SameSite=Strict cookie holding a second random value, and spent by that exchange (a
  link left in a browser's history or a shared screen signs no one else in); without the cookie
  nothing but that exchange answers. A browser already signed in that opens the spent link again
  keeps its session; any other is refused (410), and a new link is announced where the console
  was started (its terminal), so the operator can sign in another browser without a restart;
- every response carries a Content-Security-Policy that allows only this origin's own scripts,
  styles and connections: no inline script, no third-party origin.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from starlette.datastructures import URL, Headers, QueryParams
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import cookie_parser
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

COOKIE = "relevo_console"
LOOPBACK_HOSTS = ("127.0.0.1", "localhost")
SAFE_METHODS = ("GET", "HEAD")
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "content-security-policy": CONTENT_SECURITY_POLICY,
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
    "x-frame-options": "DENY",
    "cache-control": "no-store",
}


# What exchange() makes of a token.
EXCHANGED, SPENT, WRONG = "exchanged", "spent", "wrong"


def _token() -> str:
    return secrets.token_urlsafe(32)


@dataclass
class ConsoleSecrets:
    """The token printed in the URL, and the session value the cookie carries after the exchange.
    Each token signs a browser in once: the printed one, and each new one a spent token's
    refusal hands out (fresh_token)."""

    token: str = field(default_factory=_token)
    session: str = field(default_factory=_token)
    _unused: list[str] = field(default_factory=list, init=False, repr=False)
    _spent: list[str] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        self._unused.append(self.token)

    def url(self, port: int, token: str | None = None) -> str:
        """The sign-in link: the printed token's, or `token`'s."""
        return f"http://127.0.0.1:{port}/?token={token or self.token}"

    def exchange(self, token: str) -> str:
        """EXCHANGED (the token was unused, and now is spent), SPENT or WRONG."""
        for unused in self._unused:
            if secrets.compare_digest(token, unused):
                self._unused.remove(unused)
                self._spent.append(unused)
                return EXCHANGED
        if any(secrets.compare_digest(token, spent) for spent in self._spent):
            return SPENT
        return WRONG

    def fresh_token(self) -> str:
        """A token not used yet: the one handed out before, while it is unused, else a new one
        (at most one is unused at a time)."""
        if not self._unused:
            self._unused.append(_token())
        return self._unused[-1]


def spent_link_page(announced: bool) -> HTMLResponse:
    """410 for a link used already, by a browser without the session: what happened, and how to
    get in."""
    where = (
        "A new link was just printed in the terminal where <code>relevo console</code> runs: open it in "
        "this browser."
        if announced
        else "Open this console from the browser that used the link, or restart <code>relevo console</code> "
        "for a new one."
    )
    body = (
        '<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Link already used · Relevo '
        "console</title></head>"
        "<body><h1>This console link was already used</h1>"
        "<p>A link <code>relevo console</code> prints signs one browser in, once: the browser that opened "
        "it first "
        f"keeps its session.</p><p>{where}</p></body></html>"
    )
    return HTMLResponse(body, status_code=410)


def allowed_origins(port: int) -> frozenset[str]:
    return frozenset(f"http://{host}:{port}" for host in LOOPBACK_HOSTS)


def _origin_of(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def origin_refusal(method: str, headers: Headers, origins: frozenset[str]) -> str | None:
    """Why a request is cross-origin (and refused), or None."""
    if headers.get("sec-fetch-site") == "cross-site":
        return "cross-site request"
    origin = headers.get("origin")
    if origin is not None and origin not in origins:
        return f"origin {origin} is not this console's"
    if method in SAFE_METHODS or origin is not None:
        return None
    referer = headers.get("referer")
    if referer is None:
        return "a request that changes something must carry Origin"
    if _origin_of(referer) not in origins:
        return f"referer {_origin_of(referer)} is not this console's"
    return None


class ConsoleGuard:
    """ASGI middleware: origin and session checks, the token exchange, and the security headers on
    every response (a refusal included)."""

    def __init__(
        self,
        app: ASGIApp,
        console_secrets: ConsoleSecrets,
        port: int,
        announce: Callable[[str], None] | None = None,
    ) -> None:
        self.app = app
        self.secrets = console_secrets
        self.port = port
        # Where a new sign-in link goes when a spent one comes back (the console's terminal).
        self.announce = announce

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [
                    (name, value)
                    for name, value in message.get("headers", [])
                    if name.decode().lower() not in SECURITY_HEADERS
                ]
                headers += [(name.encode(), value.encode()) for name, value in SECURITY_HEADERS.items()]
                message = {**message, "headers": headers}
            await send(message)

        response = self.refusal(scope)
        if response is not None:
            await response(scope, receive, send_with_headers)
            return
        await self.app(scope, receive, send_with_headers)

    def refusal(self, scope: Scope) -> Response | None:
        headers = Headers(scope=scope)
        why = origin_refusal(scope["method"], headers, allowed_origins(self.port))
        if why is not None:
            return PlainTextResponse(f"refused: {why}", status_code=403)
        url = URL(scope=scope)
        token = QueryParams(url.query).get("token")
        cookie = cookie_parser(headers.get("cookie", "")).get(COOKIE)
        signed_in = cookie is not None and secrets.compare_digest(cookie, self.secrets.session)
        if token is not None:
            outcome = self.secrets.exchange(token)
            if outcome == WRONG:
                return PlainTextResponse(
                    "refused: wrong token; open the URL `relevo console` printed", status_code=403
                )
            if outcome == SPENT and not signed_in:
                if self.announce is not None:
                    self.announce(self.secrets.url(self.port, self.secrets.fresh_token()))
                return spent_link_page(announced=self.announce is not None)
            # The token leaves the address bar; a browser signed in already keeps its cookie.
            rest = url.remove_query_params("token")
            redirect = RedirectResponse(rest.path + (f"?{rest.query}" if rest.query else ""), status_code=303)
            if outcome == EXCHANGED:
                redirect.set_cookie(COOKIE, self.secrets.session, httponly=True, samesite="strict", path="/")
            return redirect
        if not signed_in:
            return PlainTextResponse(
                "no console session: open the URL `relevo console` printed (it carries the token)",
                status_code=401,
            )
        return None


def guarded(
    app: ASGIApp, console_secrets: ConsoleSecrets, port: int, announce: Callable[[str], None] | None = None
) -> ASGIApp:
    """The app behind the host check (outermost: a rebound name is refused first), then the guard."""
    return TrustedHostMiddleware(
        ConsoleGuard(app, console_secrets, port, announce), allowed_hosts=list(LOOPBACK_HOSTS)
    )
