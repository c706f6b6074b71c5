"""App Store Connect's Build Uploads API as the app_store_upload effect uses it (Apple's
"Uploading builds" / buildUploads, buildUploadFiles, builds): JSON:API requests with a fresh ES256
token each, and the two ways a request can go wrong kept apart -- Apple answered no (`Refused`:
a 4xx with its errors; the request took no effect) and no answer to go by (`NoAnswer`: the
connection dropped, a timeout, a 5xx or a 504 from the edge; the request may have taken effect,
so the caller looks before it repeats anything)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO
from urllib.parse import quote, urlencode, urlsplit

import urllib3

# One request's budget: connecting, then each read (an upload part is at most a few MB).
TIMEOUT = urllib3.Timeout(connect=10, read=60)
PAGE = 200  # the largest `limit` the list operations take
MAX_PAGES = 10


class NoAnswer(Exception):
    """No answer to go by: the request may or may not have taken effect."""


class Refused(Exception):
    """Apple's answer was a 4xx: `status`, and the errors' codes and details as Apple words them."""

    def __init__(self, status: int, errors: list[dict[str, Any]]) -> None:
        self.status = status
        self.codes = [str(e.get("code", "")) for e in errors]
        self.detail = "; ".join(
            f"{e.get('code', '')}: {e.get('detail') or e.get('title', '')}" for e in errors
        )
        super().__init__(f"{status} {self.detail}")


@dataclass(frozen=True)
class Upload:
    """A build upload as the probe and the wait read it."""

    id: str
    version: str
    build: str
    state: str  # AWAITING_UPLOAD, PROCESSING, FAILED, COMPLETE
    errors: list[str]
    sha256: str | None  # the asset file's SHA_256 checksum, once its bytes were committed
    build_id: str | None

    @property
    def error_codes(self) -> list[str]:
        return [e.split(":", 1)[0] for e in self.errors]


def _id(value: str) -> str:
    # An id of Apple's answer put in a path: never a path of its own.
    return quote(value, safe="")


class ConnectClient:
    def __init__(
        self, base_url: str, token: Callable[[], str], http: urllib3.PoolManager | None = None
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        # No retries and no redirects: a repeated request is the caller's decision, after a look.
        self.http = http or urllib3.PoolManager(retries=False, timeout=TIMEOUT)

    def request(
        self, method: str, path: str, query: dict[str, str] | None = None, body: Any = None
    ) -> dict[str, Any]:
        url = self.base_url + path + ("?" + urlencode(query) if query else "")
        headers = {"Authorization": f"Bearer {self.token()}", "Accept": "application/json"}
        payload = None
        if body is not None:
            headers["Content-Type"] = "application/json"
            payload = json.dumps(body).encode()
        try:
            answer = self.http.request(method, url, body=payload, headers=headers, redirect=False)
        except urllib3.exceptions.HTTPError as error:
            raise NoAnswer(f"{method} {path}: {type(error).__name__}") from None
        return self._document(method, path, answer)

    def _document(self, method: str, path: str, answer: urllib3.BaseHTTPResponse) -> dict[str, Any]:
        try:
            document = json.loads(answer.data) if answer.data else {}
        except ValueError:
            document = None
        if 400 <= answer.status < 500 and isinstance(document, dict) and document.get("errors"):
            raise Refused(answer.status, list(document["errors"]))
        if answer.status >= 300 or not isinstance(document, dict):
            raise NoAnswer(f"{method} {path}: HTTP {answer.status}")
        return document

    def _pages(self, path: str, query: dict[str, str]) -> Iterator[dict[str, Any]]:
        document = self.request("GET", path, {**query, "limit": str(PAGE)})
        for _ in range(MAX_PAGES):
            yield document
            following = (document.get("links") or {}).get("next")
            if not following:
                return
            parts = urlsplit(following)
            document = self.request(
                "GET", parts.path, dict(p.split("=", 1) for p in parts.query.split("&") if p)
            )

    # -- reads

    def app(self, app_id: str) -> dict[str, Any]:
        return dict(self.request("GET", f"/v1/apps/{_id(app_id)}")["data"])

    def uploads(self, app_id: str, platform: str, version: str, build: str | None = None) -> list[Upload]:
        """The app's uploads of that version (and build number), with their files' checksums."""
        query = {
            "filter[cfBundleShortVersionString]": version,
            "filter[platform]": platform,
            "include": "assetFile",
        }
        if build is not None:
            query["filter[cfBundleVersion]"] = build
        found = []
        for document in self._pages(f"/v1/apps/{_id(app_id)}/buildUploads", query):
            files = {
                f["id"]: f for f in document.get("included") or [] if f.get("type") == "buildUploadFiles"
            }
            found += [_upload(resource, files) for resource in document.get("data") or []]
        return found

    def upload(self, upload_id: str) -> Upload:
        document = self.request("GET", f"/v1/buildUploads/{_id(upload_id)}", {"include": "assetFile"})
        files = {f["id"]: f for f in document.get("included") or [] if f.get("type") == "buildUploadFiles"}
        upload = _upload(document["data"], files)
        if upload.sha256 is None and "assetFile" in (document["data"].get("relationships") or {}):
            # An answer that did not include the file: read it.
            upload_files = self.upload_files(upload.id)
            checksum = next((_checksum(f) for f in upload_files if _checksum(f)), None)
            upload = Upload(**{**upload.__dict__, "sha256": checksum})
        return upload

    def upload_files(self, upload_id: str) -> list[dict[str, Any]]:
        path = f"/v1/buildUploads/{_id(upload_id)}/buildUploadFiles"
        return list(self.request("GET", path, {"limit": str(PAGE)}).get("data") or [])

    def build_numbers(self, app_id: str, version: str) -> list[str]:
        """The build numbers the app's builds of that version have (builds made otherwise than by
        the Build Uploads API too: Xcode, Transporter)."""
        query = {
            "filter[app]": app_id,
            "filter[preReleaseVersion.version]": version,
            "fields[builds]": "version",
        }
        return [
            str(b["attributes"]["version"])
            for document in self._pages("/v1/builds", query)
            for b in document.get("data") or []
            if (b.get("attributes") or {}).get("version")
        ]

    def processing_state(self, build_id: str) -> str:
        document = self.request("GET", f"/v1/builds/{_id(build_id)}", {"fields[builds]": "processingState"})
        return str(document["data"]["attributes"]["processingState"])

    # -- writes

    def create_upload(self, app_id: str, platform: str, version: str, build: str) -> str:
        body = {
            "data": {
                "type": "buildUploads",
                "attributes": {
                    "cfBundleShortVersionString": version,
                    "cfBundleVersion": build,
                    "platform": platform,
                },
                "relationships": {"app": {"data": {"type": "apps", "id": app_id}}},
            }
        }
        return str(self.request("POST", "/v1/buildUploads", body=body)["data"]["id"])

    def create_file(self, upload_id: str, file_name: str, size: int, uti: str) -> dict[str, Any]:
        body = {
            "data": {
                "type": "buildUploadFiles",
                "attributes": {"fileName": file_name, "fileSize": size, "uti": uti, "assetType": "ASSET"},
                "relationships": {"buildUpload": {"data": {"type": "buildUploads", "id": upload_id}}},
            }
        }
        return dict(self.request("POST", "/v1/buildUploadFiles", body=body)["data"])

    def send_parts(self, upload_file: dict[str, Any], source: BinaryIO) -> None:
        """The bytes to each of the file's upload operations (presigned: no bearer token to them)."""
        for part in upload_file["attributes"].get("uploadOperations") or []:
            if urlsplit(part["url"]).scheme not in ("https", "http"):
                raise NoAnswer(f"an upload operation's URL is not http(s): {part['url'][:60]}")
            source.seek(int(part["offset"]))
            chunk = source.read(int(part["length"]))
            headers = {h["name"]: h["value"] for h in part.get("requestHeaders") or []}
            try:
                answer = self.http.request(
                    part["method"], part["url"], body=chunk, headers=headers, redirect=False
                )
            except urllib3.exceptions.HTTPError as error:
                raise NoAnswer(f"upload part {part.get('partNumber')}: {type(error).__name__}") from None
            if answer.status >= 300:
                raise NoAnswer(f"upload part {part.get('partNumber')}: HTTP {answer.status}")

    def commit_file(self, file_id: str, sha256: str) -> dict[str, Any]:
        checksum = {"file": {"hash": sha256, "algorithm": "SHA_256"}}
        body = {
            "data": {
                "type": "buildUploadFiles",
                "id": file_id,
                "attributes": {"uploaded": True, "sourceFileChecksums": checksum},
            }
        }
        return dict(self.request("PATCH", f"/v1/buildUploadFiles/{_id(file_id)}", body=body)["data"])

    def file(self, file_id: str) -> dict[str, Any]:
        return dict(self.request("GET", f"/v1/buildUploadFiles/{_id(file_id)}")["data"])


def _checksum(upload_file: dict[str, Any]) -> str | None:
    checksum = ((upload_file.get("attributes") or {}).get("sourceFileChecksums") or {}).get("file") or {}
    return (
        str(checksum["hash"]).lower()
        if checksum.get("algorithm") == "SHA_256" and checksum.get("hash")
        else None
    )


def _upload(resource: dict[str, Any], files: dict[str, dict[str, Any]]) -> Upload:
    attributes = resource.get("attributes") or {}
    relationships = resource.get("relationships") or {}
    state = attributes.get("state") or {}
    file_ref = (relationships.get("assetFile") or {}).get("data") or {}
    build_ref = (relationships.get("build") or {}).get("data") or {}
    return Upload(
        id=str(resource["id"]),
        version=str(attributes.get("cfBundleShortVersionString", "")),
        build=str(attributes.get("cfBundleVersion", "")),
        state=str(state.get("state", "")),
        errors=[f"{e.get('code', '')}: {e.get('description', '')}" for e in state.get("errors") or []],
        sha256=_checksum(files.get(str(file_ref.get("id")), {})),
        build_id=str(build_ref["id"]) if build_ref.get("id") else None,
    )
