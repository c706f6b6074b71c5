"""A stateful stand-in for GitHub's releases and their assets, on loopback, for the
github_release_asset effect's tests. The recorder (relevo_local.recorder) answers from a script;
an asset uploaded once must be there for the next attempt's probe, as at GitHub, so this one keeps
what it was sent: releases by tag, their assets (name, bytes, digest `sha256:…`, state).

Every request is checked against GitHub's pinned REST description (local/relevo_local/github/openapi.py:
the operation, its path and required query parameters) and every answer too (the operation's
status and its schema); what departs is kept in `mismatches`, which the fixture asserts empty.

Faults, as GitHub gives them: the answer to an upload lost after the asset was stored, an upload
answered 502 that left an unfinished asset (a state other than `uploaded`, no digest), an answer of
a given status, every connection cut (the network)."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from relevo_local.github.openapi import check_answer, check_call

TOKEN = "ghs_releasewriter0000000000000000000000"
CREATED = "2026-12-06T10:00:00Z"


@dataclass
class Asset:
    id: int
    name: str
    content_type: str
    data: bytes
    state: str = "uploaded"
    # GitHub gives no digest for assets uploaded before it computed them (June 2025).
    digested: bool = True

    @property
    def digest(self) -> str | None:
        # GitHub computes the digest of an asset once its upload finished; none before.
        if self.state != "uploaded" or not self.digested:
            return None
        return f"sha256:{hashlib.sha256(self.data).hexdigest()}"


@dataclass
class Release:
    id: int
    owner: str
    repo: str
    tag: str
    assets: list[Asset] = field(default_factory=list)


@dataclass(frozen=True)
class Received:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes


class GithubReleases:
    def __init__(self, token: str = TOKEN) -> None:
        self.token = token
        self.releases: list[Release] = []
        self.requests: list[Received] = []
        self.mismatches: list[str] = []
        # Where the releases' upload_url points (this server unless a test says otherwise).
        self.upload_origin: str | None = None
        self._next_id = 1000
        self._lock = threading.Lock()
        self._lose_upload_answers = 0
        self._unfinished_uploads = 0
        self._statuses: list[int] = []
        self.cut = False
        responder = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                if responder.cut:
                    self.close_connection = True
                    return  # the network: no answer at all
                parts = urlsplit(self.path)
                path = parts.path
                query = dict(parse_qsl(parts.query))
                headers = {k.lower(): v for k, v in self.headers.items()}
                with responder._lock:
                    responder.requests.append(Received(self.command, path, query, headers, body))
                json_body = json.loads(body) if body and "json" in headers.get("content-type", "") else None
                try:
                    check_call(self.command, path, json_body, query)
                except AssertionError as exc:
                    responder.mismatches.append(str(exc))
                status, answer, lose = responder._answer(self.command, path, query, headers, body)
                if lose:
                    self.close_connection = True
                    return  # stored; the answer never reaches the client
                responder.mismatches.extend(check_answer(self.command, path, status, answer))
                data = b"" if answer is None else json.dumps(answer).encode()
                self.send_response(status)
                if data:
                    self.send_header("Content-Type", "application/json; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_DELETE = do_PATCH = _serve  # noqa: N815 (http.server's naming)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), daemon=True, name="github-releases"
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> GithubReleases:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    # What a test sets up

    def add_release(self, repository: str, tag: str) -> Release:
        owner, repo = repository.split("/")
        release = Release(self._new_id(), owner, repo, tag)
        self.releases.append(release)
        return release

    def add_asset(
        self, release: Release, name: str, data: bytes, state: str = "uploaded", digested: bool = True
    ) -> Asset:
        asset = Asset(self._new_id(), name, "application/zip", data, state, digested)
        release.assets.append(asset)
        return asset

    def lose_upload_answers(self, times: int = 1) -> None:
        """The next uploads are stored, and their answers lost (the connection closes)."""
        self._lose_upload_answers = times

    def fail_uploads_unfinished(self, times: int = 1) -> None:
        """The next uploads are answered 502 and leave an empty asset not `uploaded` (GitHub: "When
        an upstream failure occurs, you will receive a `502 Bad Gateway` status. This may leave an
        empty asset with a state of `starter`"; the description's enum names it `open`)."""
        self._unfinished_uploads = times

    def answer_status(self, status: int, times: int = 1) -> None:
        """The next requests are answered `status` with GitHub's error body, and do nothing."""
        self._statuses.extend([status] * times)

    def uploads(self) -> list[Received]:
        return [r for r in self.requests if r.method == "POST" and r.path.endswith("/assets")]

    # Serving

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def _answer(
        self, method: str, path: str, query: dict[str, str], headers: dict[str, str], body: bytes
    ) -> tuple[int, Any, bool]:
        with self._lock:
            if self._statuses:
                status = self._statuses.pop(0)
                return (
                    status,
                    {"message": f"status {status}", "documentation_url": "https://docs.github.com"},
                    False,
                )
            authorization = headers.get("authorization", "")
            if authorization not in (f"Bearer {self.token}", f"token {self.token}"):
                return (
                    401,
                    {"message": "Bad credentials", "documentation_url": "https://docs.github.com/rest"},
                    False,
                )
            segments = path.strip("/").split("/")
            if len(segments) < 4 or segments[0] != "repos" or segments[3] != "releases":
                return 404, _not_found(), False
            owner, repo, rest = segments[1], segments[2], segments[4:]
            if method == "GET" and rest[:1] == ["tags"]:
                release = self._release(owner, repo, tag=unquote("/".join(rest[1:])))
                return (200, self._render_release(release), False) if release else (404, _not_found(), False)
            if rest[:1] == ["assets"] and len(rest) == 2 and method == "DELETE":
                for release in self._of(owner, repo):
                    for asset in release.assets:
                        if str(asset.id) == rest[1]:
                            release.assets.remove(asset)
                            return 204, None, False
                return 404, _not_found(), False
            if len(rest) == 2 and rest[1] == "assets":
                release = self._release(owner, repo, release_id=rest[0])
                if release is None:
                    return 404, _not_found(), False
                if method == "GET":
                    per_page = min(int(query.get("per_page", 30)), 100)
                    page = int(query.get("page", 1))
                    shown = release.assets[(page - 1) * per_page : page * per_page]
                    return 200, [self._render_asset(release, a) for a in shown], False
                if method == "POST":
                    return self._upload(release, query, headers, body)
            return 404, _not_found(), False

    def _upload(
        self, release: Release, query: dict[str, str], headers: dict[str, str], body: bytes
    ) -> tuple[int, Any, bool]:
        name = query.get("name", "")
        if any(a.name == name for a in release.assets):
            # GitHub: "If you upload an asset with the same filename as another uploaded asset,
            # you'll receive an error and must delete the old file before you can re-upload".
            return 422, {"message": "Validation Failed", "errors": [{"code": "already_exists"}]}, False
        if self._unfinished_uploads:
            self._unfinished_uploads -= 1
            release.assets.append(Asset(self._new_id(), name, headers.get("content-type", ""), b"", "open"))
            return 502, {"message": "Bad Gateway", "documentation_url": "https://docs.github.com/rest"}, False
        asset = Asset(self._new_id(), name, headers.get("content-type", ""), body)
        release.assets.append(asset)
        if self._lose_upload_answers:
            self._lose_upload_answers -= 1
            return 0, None, True
        return 201, self._render_asset(release, asset), False

    def _of(self, owner: str, repo: str) -> Iterator[Release]:
        return (r for r in self.releases if (r.owner, r.repo) == (owner, repo))

    def _release(
        self, owner: str, repo: str, tag: str | None = None, release_id: str | None = None
    ) -> Release | None:
        for release in self._of(owner, repo):
            if release.tag == tag or str(release.id) == release_id:
                return release
        return None

    def _render_release(self, release: Release) -> dict[str, Any]:
        base = f"{self.url}/repos/{release.owner}/{release.repo}"
        uploads = f"{self.upload_origin or self.url}/repos/{release.owner}/{release.repo}"
        return {
            "url": f"{base}/releases/{release.id}",
            "html_url": f"https://github.com/{release.owner}/{release.repo}/releases/tag/{release.tag}",
            "assets_url": f"{base}/releases/{release.id}/assets",
            "upload_url": f"{uploads}/releases/{release.id}/assets{{?name,label}}",
            "tarball_url": None,
            "zipball_url": None,
            "id": release.id,
            "node_id": f"RE_{release.id}",
            "tag_name": release.tag,
            "target_commitish": "main",
            "name": release.tag,
            "draft": False,
            "prerelease": False,
            "created_at": CREATED,
            "published_at": CREATED,
            "author": _user(),
            "assets": [self._render_asset(release, a) for a in release.assets],
        }

    def _render_asset(self, release: Release, asset: Asset) -> dict[str, Any]:
        downloads = f"https://github.com/{release.owner}/{release.repo}/releases/download"
        return {
            "url": f"{self.url}/repos/{release.owner}/{release.repo}/releases/assets/{asset.id}",
            "browser_download_url": f"{downloads}/{release.tag}/{asset.name}",
            "id": asset.id,
            "node_id": f"RA_{asset.id}",
            "name": asset.name,
            "label": None,
            "state": asset.state,
            "content_type": asset.content_type,
            "size": len(asset.data),
            "digest": asset.digest,
            "download_count": 0,
            "created_at": CREATED,
            "updated_at": CREATED,
            "uploader": _user(),
        }


def _not_found() -> dict[str, str]:
    return {"message": "Not Found", "documentation_url": "https://docs.github.com/rest"}


def _user() -> dict[str, Any]:
    api = "https://api.github.com/users/release-bot"
    return {
        "login": "release-bot",
        "id": 7,
        "node_id": "U_7",
        "avatar_url": "https://avatars.githubusercontent.com/u/7",
        "gravatar_id": "",
        "url": api,
        "html_url": "https://github.com/release-bot",
        "followers_url": f"{api}/followers",
        "following_url": f"{api}/following{{/other_user}}",
        "gists_url": f"{api}/gists{{/gist_id}}",
        "starred_url": f"{api}/starred{{/owner}}{{/repo}}",
        "subscriptions_url": f"{api}/subscriptions",
        "organizations_url": f"{api}/orgs",
        "repos_url": f"{api}/repos",
        "events_url": f"{api}/events{{/privacy}}",
        "received_events_url": f"{api}/received_events",
        "type": "Bot",
        "site_admin": False,
    }


@contextmanager
def github_releases(token: str = TOKEN) -> Iterator[GithubReleases]:
    """The responder started; at the end, every request and answer asserted to be GitHub's."""
    responder = GithubReleases(token).start()
    try:
        yield responder
        assert responder.mismatches == [], "requests or answers departed from GitHub's description"
    finally:
        responder.stop()
