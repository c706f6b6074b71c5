"""The local Apple service for a test (relevo_local.apple): started on loopback with a team key
the test made (ES256, as App Store Connect's are), a client that signs its tokens with it, and at
the end the service's record of mismatches with Apple's description asserted empty -- a request
or answer that departs from it fails the test that made it."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import jwt
from cryptography.hazmat.primitives.asymmetric import ec

from relevo_local.apple.auth import AUDIENCE, ApiKey
from relevo_local.apple.service import AppleService

ISSUER = "57246542-96fe-1a63-e053-0824d011072a"
KEY_ID = "2X9R4HXF34"


@dataclass
class TeamKey:
    issuer: str
    key_id: str
    private_key: ec.EllipticCurvePrivateKey

    def token(self, now: float, lifetime: float = 19 * 60, **overrides: Any) -> str:
        claims: dict[str, Any] = {
            "iss": self.issuer,
            "iat": int(now),
            "exp": int(now + lifetime),
            "aud": AUDIENCE,
        }
        claims.update(overrides)
        return jwt.encode(claims, self.private_key, algorithm="ES256", headers={"kid": self.key_id})


def new_key(issuer: str = ISSUER, key_id: str = KEY_ID) -> TeamKey:
    return TeamKey(issuer, key_id, ec.generate_private_key(ec.SECP256R1()))


class Client:
    """httpx against the service, each request with a fresh token by the service's clock."""

    def __init__(self, service: AppleService, key: TeamKey) -> None:
        self.service = service
        self.key = key
        self.http = httpx.Client(base_url=service.url, timeout=5)

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key.token(self.service.clock.now().timestamp())}"}

    def get(self, path: str, **params: str) -> httpx.Response:
        return self.http.get(path, params=params, headers=self.headers())

    def post(self, path: str, body: Any) -> httpx.Response:
        return self.http.post(path, json=body, headers=self.headers())

    def patch(self, path: str, body: Any) -> httpx.Response:
        return self.http.patch(path, json=body, headers=self.headers())


@contextmanager
def local_apple() -> Iterator[tuple[AppleService, Client]]:
    key = new_key()
    service = AppleService().start()
    service.add_key(ApiKey(key.issuer, key.key_id, key.private_key.public_key()))
    client = Client(service, key)
    try:
        yield service, client
        assert service.take_mismatches() == [], "requests or answers departed from Apple's description"
    finally:
        client.http.close()
        service.stop()


def upload_body(
    app_id: str, version: str = "1.4.0", build: str = "42", platform: str = "IOS"
) -> dict[str, Any]:
    return {
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


def send_build(
    client: Client, app_id: str, ipa: bytes, version: str = "1.4.0", build: str = "42"
) -> tuple[str, str]:
    """The Build Uploads flow up to its commit: the upload, its asset file, the bytes to each
    upload operation. Returns the upload's id and the file's."""
    created = client.post("/v1/buildUploads", upload_body(app_id, version, build))
    assert created.status_code == 201, created.text
    upload_id: str = created.json()["data"]["id"]
    file_body = {
        "data": {
            "type": "buildUploadFiles",
            "attributes": {
                "fileName": "App.ipa",
                "fileSize": len(ipa),
                "uti": "com.apple.ipa",
                "assetType": "ASSET",
            },
            "relationships": {"buildUpload": {"data": {"type": "buildUploads", "id": upload_id}}},
        }
    }
    reserved = client.post("/v1/buildUploadFiles", file_body)
    assert reserved.status_code == 201, reserved.text
    upload_file = reserved.json()["data"]
    for part in upload_file["attributes"]["uploadOperations"]:
        chunk = ipa[part["offset"] : part["offset"] + part["length"]]
        headers = {h["name"]: h["value"] for h in part["requestHeaders"]}
        assert httpx.request(part["method"], part["url"], content=chunk, headers=headers).status_code == 200
    return upload_id, str(upload_file["id"])


def upload_build(client: Client, app_id: str, ipa: bytes, version: str = "1.4.0", build: str = "42") -> str:
    """The whole flow, the commit with the file's SHA-256 included. Returns the upload's id."""
    upload_id, file_id = send_build(client, app_id, ipa, version, build)
    committed = commit_file(client, file_id, ipa)
    assert committed.status_code == 200, committed.text
    return upload_id


def commit_body(file_id: str, ipa: bytes) -> dict[str, Any]:
    checksum = {"file": {"hash": hashlib.sha256(ipa).hexdigest(), "algorithm": "SHA_256"}}
    return {
        "data": {
            "type": "buildUploadFiles",
            "id": file_id,
            "attributes": {"uploaded": True, "sourceFileChecksums": checksum},
        }
    }


def commit_file(client: Client, file_id: str, ipa: bytes) -> httpx.Response:
    return client.patch(f"/v1/buildUploadFiles/{file_id}", commit_body(file_id, ipa))
