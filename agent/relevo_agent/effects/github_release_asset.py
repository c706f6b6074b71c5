"""github_release_asset: a file attached to a GitHub release, once, by tag, asset name and sha256
(docs/release-effects.md). GitHub's REST calls, as its description names them
(https://docs.github.com/rest/releases): repos/get-release-by-tag, repos/list-release-assets,
repos/upload-release-asset (to the release's `upload_url`), repos/delete-release-asset.

Journaled before anything is sent: sha256, asset_name, tag, repository.

perform -- the release by its tag (none: EFFECT_REFUSED), then the asset of that name:
  uploaded with the file's digest  done, nothing sent (an earlier attempt's upload went through)
  uploaded with another digest     EFFECT_REFUSED: never overwritten
  uploaded without a digest        EFFECT_REFUSED: GitHub computed none, nothing proves it is this file
  not uploaded (state `starter`    deleted, said in the stage's log, then uploaded: an upload that
    or `open`: an upload that      did not finish. GitHub: "This may leave an empty asset with a
    did not finish)                state of `starter`. It can be safely deleted."
  none                             uploaded; the answer's digest must be the file's (else CHECKSUM)

probe -- reads only; the asset of that name in the release of that tag:
  uploaded with the file's digest  DONE (asset_id, asset_url): the same bytes at the same name and
                                   tag are this effect, whichever attempt sent them
  none, or no release              ABSENT
  not uploaded (see above)         ABSENT, the leftover named in the evidence: the perform that
                                   follows deletes it before it uploads (in the stage's log)
  another digest, or none          CANNOT_TELL (manual review)
  401, 403, 5xx, the network       CANNOT_TELL

resume -- GitHub keeps no upload under way (an upload is one request: it went through, or it left
an unfinished asset), so this kind never answers IN_PROGRESS; resume is probe, then perform when
ABSENT, and manual review when the probe cannot tell.

The token (a secret under the project's release prefix: a JSON object with `token`; the agent
refuses a secret that is not a JSON object) goes only to the API's host and the release's upload
host, and is never logged.
"""

from __future__ import annotations

import hashlib
import mimetypes
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlsplit

import urllib3

from relevo_agent.effects.kind import Answer, EffectContext, EffectFailed, ProbeAnswer
from relevo_core.models.effect import GithubReleaseAsset
from relevo_core.models.errors import ErrorClass

API_VERSION = "2022-11-28"
PER_PAGE = 100
# GitHub allows 1000 assets per release: 10 pages of 100.
MAX_PAGES = 10
# Names GitHub keeps as given: it renames "special characters, non-alphanumeric characters, and
# leading or trailing periods" (repos/upload-release-asset), and a renamed asset is never found by
# its name again -- the next probe would say ABSENT and upload a second one.
ASSET_NAME = re.compile(r"^[A-Za-z0-9_-]([A-Za-z0-9._-]*[A-Za-z0-9_-])?$")
# A tag is a git ref name: no `..`, no component starting with `.`, none of git's forbidden characters
# (git-check-ref-format); so it cannot lead the request's path anywhere else.
TAG_FORBIDDEN = re.compile(r"(\.\.|^/|/$|//|(^|/)\.|\.lock(/|$)|@\{|[\x00-\x20\x7f~^:?*\[\\])")
CONNECT_SEC = 10.0
CALL_SEC = 30.0


class _Unreachable(Exception):
    """Nothing answered: refused, reset, timed out, or the answer lost."""

    def __init__(self, what: str, timed_out: bool) -> None:
        super().__init__(what)
        self.timed_out = timed_out


class _Answered(Exception):
    """GitHub answered with a status the call did not expect."""

    def __init__(self, status: int, message: str, rate_limited: bool) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.rate_limited = rate_limited


class GithubReleaseAssetEffect:
    def __init__(self, spec: GithubReleaseAsset) -> None:
        self.spec = spec
        self.owner, self.repo = spec.repository.split("/")

    # The contract (relevo_agent.effects.kind.EffectKind)

    def perform(self, context: EffectContext) -> dict[str, str]:
        name = self._asset_name(context)
        self._check_tag()
        sha256 = _sha256(context)
        identifiers = {
            "sha256": sha256,
            "asset_name": name,
            "tag": self.spec.tag,
            "repository": self.spec.repository,
        }
        context.record(identifiers)
        github = _GitHub(context, self._token(context))
        try:
            release = self._release(github)
            if release is None:
                raise EffectFailed(
                    ErrorClass.EFFECT_REFUSED,
                    f"github_release_asset: no release for tag {self.spec.tag} in {self.spec.repository} "
                    "(or the token cannot see the repository)",
                )
            found = self._asset(github, release, name)
            if found is not None and found.get("state") != "uploaded":
                context.line(
                    f"github_release_asset: deleting asset {found.get('id')} ({name}, state "
                    f"{found.get('state')}): an upload that did not finish, which GitHub says can be"
                    " safely deleted"
                )
                github.call("DELETE", self._api(f"releases/assets/{int(found['id'])}"), expect=(204, 404))
                found = None
            if found is not None:
                if found.get("digest") == f"sha256:{sha256}":
                    context.line(
                        f"github_release_asset: {name} is already on {self.spec.tag} with this sha256"
                    )
                    return {**identifiers, **_asset_values(found)}
                raise EffectFailed(ErrorClass.EFFECT_REFUSED, self._other_asset(found, name, sha256))
            asset = self._upload(github, context, release, name)
        except _Unreachable as exc:
            raise EffectFailed(
                ErrorClass.NETWORK_TIMEOUT if exc.timed_out else ErrorClass.CONNECTION_RESET,
                f"github_release_asset: GitHub did not answer ({exc}); the retry probes before it uploads",
            ) from None
        except _Answered as exc:
            raise EffectFailed(_failure_class(exc), f"github_release_asset: {exc.message}") from None
        if asset.get("digest") != f"sha256:{sha256}":
            raise EffectFailed(
                ErrorClass.CHECKSUM,
                f"github_release_asset: GitHub stored asset {asset.get('id')} with digest "
                f"{asset.get('digest')}, not the file's sha256:{sha256}",
            )
        if asset.get("name") != name:
            raise EffectFailed(
                ErrorClass.EFFECT_REJECTED,
                f"github_release_asset: GitHub named the asset {asset.get('name')!r}, not {name!r}",
            )
        values = {**identifiers, **_asset_values(asset)}
        context.line(
            f"github_release_asset: uploaded {name} to {self.spec.tag} as asset {values['asset_id']}"
        )
        return values

    def probe(self, context: EffectContext, recorded: Mapping[str, str]) -> ProbeAnswer:
        try:
            name = self._asset_name(context)
            self._check_tag()
            sha256 = _sha256(context)
            if recorded.get("sha256") not in (None, sha256):
                return ProbeAnswer(
                    Answer.CANNOT_TELL,
                    f"the file's sha256 is {sha256}, the previous attempt recorded {recorded['sha256']}",
                )
            github = _GitHub(context, self._token(context))
            release = self._release(github)
            if release is None:
                return ProbeAnswer(Answer.ABSENT, f"no release for tag {self.spec.tag}: no asset {name}")
            found = self._asset(github, release, name)
        except EffectFailed as exc:
            return ProbeAnswer(Answer.CANNOT_TELL, exc.message)
        except _Unreachable as exc:
            return ProbeAnswer(Answer.CANNOT_TELL, f"GitHub did not answer ({exc})")
        except _Answered as exc:
            return ProbeAnswer(Answer.CANNOT_TELL, exc.message)
        if found is None:
            return ProbeAnswer(Answer.ABSENT, f"no asset {name} on release {self.spec.tag}")
        if found.get("state") != "uploaded":
            return ProbeAnswer(
                Answer.ABSENT,
                f"asset {found.get('id')} ({name}) is in state {found.get('state')}: an upload that did not "
                "finish; it is deleted before the upload",
            )
        if found.get("digest") == f"sha256:{sha256}":
            identifiers = {"sha256": sha256, "asset_name": name, "tag": self.spec.tag}
            values = {**identifiers, "repository": self.spec.repository, **_asset_values(found)}
            return ProbeAnswer(
                Answer.DONE,
                f"asset {found.get('id')} ({name}) on {self.spec.tag} has sha256:{sha256}",
                values,
            )
        return ProbeAnswer(Answer.CANNOT_TELL, self._other_asset(found, name, sha256))

    def resume(self, context: EffectContext, recorded: Mapping[str, str]) -> dict[str, str]:
        answer = self.probe(context, recorded)
        if answer.answer is Answer.DONE:
            return dict(answer.values)
        if answer.answer is Answer.ABSENT:
            return self.perform(context)
        raise EffectFailed(ErrorClass.MANUAL_REVIEW, f"github_release_asset: {answer.evidence}")

    # GitHub

    def _release(self, github: _GitHub) -> dict[str, Any] | None:
        status, body = github.call(
            "GET", self._api(f"releases/tags/{quote(self.spec.tag, safe='/')}"), expect=(200, 404)
        )
        return body if status == 200 and isinstance(body, dict) else None

    def _asset(self, github: _GitHub, release: dict[str, Any], name: str) -> dict[str, Any] | None:
        for page in range(1, MAX_PAGES + 1):
            _, assets = github.call(
                "GET",
                self._api(f"releases/{int(release['id'])}/assets?per_page={PER_PAGE}&page={page}"),
                expect=(200,),
            )
            if not isinstance(assets, list):
                raise _Answered(200, "the release's assets are not a list", False)
            for asset in assets:
                if isinstance(asset, dict) and asset.get("name") == name:
                    return asset
            if len(assets) < PER_PAGE:
                return None
        return None

    def _upload(
        self, github: _GitHub, context: EffectContext, release: dict[str, Any], name: str
    ) -> dict[str, Any]:
        target = self._upload_target(github, release)
        content_type = mimetypes.guess_type(name)[0] or "application/octet-stream"
        size = context.file.stat().st_size
        with context.file.open("rb") as body:
            _, asset = github.call(
                "POST",
                f"{target}?name={quote(name)}",
                expect=(201,),
                body=body,
                headers={"Content-Type": content_type, "Content-Length": str(size)},
                read_sec=max(1.0, context.time_left()),
            )
        if not isinstance(asset, dict):
            raise _Answered(201, "the upload's answer is not an asset", False)
        return asset

    def _upload_target(self, github: _GitHub, release: dict[str, Any]) -> str:
        """The release's upload_url without its URI template ({?name,label}), only if it is the
        API's own origin or its uploads host (uploads.github.com for api.github.com; the same host
        on GitHub Enterprise Server) and this release's path: the token goes nowhere else."""
        template = str(release.get("upload_url") or "")
        target = template.split("{", 1)[0]
        upload, api = urlsplit(target), urlsplit(github.base)
        api_host = api.netloc
        hosts = (
            {api_host, "uploads." + api_host.removeprefix("api.")}
            if api_host.startswith("api.")
            else {api_host}
        )
        path = f"/repos/{self.owner}/{self.repo}/releases/{int(release['id'])}/assets"
        if upload.scheme != api.scheme or upload.netloc not in hosts or not upload.path.endswith(path):
            raise EffectFailed(
                ErrorClass.EFFECT_REFUSED,
                f"github_release_asset: the release's upload_url {template!r} is not GitHub's upload host "
                f"for {self.spec.repository}: nothing sent",
            )
        return target

    def _api(self, rest: str) -> str:
        return f"/repos/{self.owner}/{self.repo}/{rest}"

    # Input

    def _asset_name(self, context: EffectContext) -> str:
        name = self.spec.name or context.file.name
        if not ASSET_NAME.match(name):
            raise EffectFailed(
                ErrorClass.EFFECT_REFUSED,
                f"github_release_asset: the asset name {name!r} would be renamed by GitHub (letters, digits, "
                "'.', '-' and '_' only, no leading or trailing '.'): name it with `name:`",
            )
        return name

    def _check_tag(self) -> None:
        if TAG_FORBIDDEN.search(self.spec.tag):
            raise EffectFailed(
                ErrorClass.EFFECT_REFUSED, f"github_release_asset: {self.spec.tag!r} is not a git tag name"
            )

    def _token(self, context: EffectContext) -> str:
        secret = context.secret(self.spec.token)
        # A JSON object with `token`, or a bare token (relevo_agent.git_credentials.git_secret's
        # convention reads it as `password`).
        token = secret.get("token") or secret.get("password")
        if not isinstance(token, str) or not token.strip() or any(c.isspace() for c in token.strip()):
            raise EffectFailed(
                ErrorClass.EFFECT_REFUSED,
                f"github_release_asset: the secret {self.spec.token} holds no token (a JSON object with "
                "`token`, or the bare token)",
            )
        return token.strip()

    def _other_asset(self, found: Mapping[str, Any], name: str, sha256: str) -> str:
        digest = found.get("digest") or "no digest"
        return (
            f"github_release_asset: asset {found.get('id')} ({name}) on {self.spec.tag} has {digest}, not "
            f"sha256:{sha256}: it is never overwritten (delete it at GitHub to upload this file)"
        )


class _GitHub:
    """GitHub's REST API with the token, each call bounded by the stage's time left; urllib3
    without retries of its own (a retry is the stage's, and it probes first)."""

    def __init__(self, context: EffectContext, token: str) -> None:
        self.context = context
        self.base = context.endpoints.github.rstrip("/")
        self.headers = {
            "Authorization": f"Bearer {token}",
            "Accept": "application/vnd.github+json",
            "X-GitHub-Api-Version": API_VERSION,
            "User-Agent": "relevo-agent",
        }
        self.pool = urllib3.PoolManager(retries=False)

    def call(
        self,
        method: str,
        path_or_url: str,
        expect: tuple[int, ...],
        body: Any = None,
        headers: Mapping[str, str] | None = None,
        read_sec: float = CALL_SEC,
    ) -> tuple[int, Any]:
        url = path_or_url if "://" in path_or_url else self.base + path_or_url
        left = max(0.5, self.context.time_left())
        timeout = urllib3.Timeout(connect=min(CONNECT_SEC, left), read=min(read_sec, left))
        try:
            answer = self.pool.request(
                method,
                url,
                body=body,
                headers={**self.headers, **(headers or {})},
                timeout=timeout,
                redirect=False,
                preload_content=True,
            )
        except urllib3.exceptions.HTTPError as exc:  # refused, reset, timed out, the answer lost
            timed_out = isinstance(exc, urllib3.exceptions.TimeoutError) or isinstance(
                getattr(exc, "reason", None), urllib3.exceptions.TimeoutError
            )
            raise _Unreachable(f"{method} {urlsplit(url).path}: {type(exc).__name__}", timed_out) from None
        parsed: Any = None
        if answer.data:
            try:
                parsed = answer.json()
            except ValueError:
                parsed = None
        if answer.status not in expect:
            message = parsed.get("message") if isinstance(parsed, dict) else None
            rate_limited = answer.status == 429 or (
                answer.status == 403 and answer.headers.get("x-ratelimit-remaining") == "0"
            )
            raise _Answered(
                answer.status,
                f"GitHub answered {answer.status} to {method} {urlsplit(url).path}"
                + (f": {message}" if message else ""),
                rate_limited,
            )
        return answer.status, parsed


def _failure_class(exc: _Answered) -> ErrorClass:
    if exc.rate_limited or exc.status >= 500:
        return ErrorClass.STORAGE_5XX  # transient: the retry probes first
    # 401 (the token refused), 403 (it may not write releases), 404, 422: nothing was stored.
    return ErrorClass.EFFECT_REFUSED


def _asset_values(asset: Mapping[str, Any]) -> dict[str, str]:
    return {"asset_id": str(asset.get("id")), "asset_url": str(asset.get("browser_download_url") or "")}


def _sha256(context: EffectContext) -> str:
    digest = hashlib.sha256()
    with context.file.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
