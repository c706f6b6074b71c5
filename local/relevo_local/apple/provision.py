"""The local Apple service beside a local stack, for `make demo` and the drills: started on the
real clock (Apple's processing and review shortened to seconds), with a team key and an app of its
own; the key stored where a project's release keys live in Secrets Manager
(relevo/<stack>/_release/<project>/…, the JSON a team stores: key_id, issuer_id, private_key), and
the `[release_endpoints]` an agent's config needs to send its release effects there."""

from __future__ import annotations

import json
import secrets
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from relevo_local.apple.auth import ApiKey
from relevo_local.apple.connect_state import Timing
from relevo_local.apple.service import AppleService

# Seconds, on the real clock: long enough that an attempt can die while Apple is still at it.
DEMO_TIMING = Timing(upload_processing_sec=3.0, build_processing_sec=5.0)
DEMO_REVIEW_SEC = 6.0


@dataclass
class LocalApple:
    service: AppleService
    key_id: str
    issuer_id: str
    private_key: ec.EllipticCurvePrivateKey
    app_id: str

    def key_secret(self) -> dict[str, str]:
        """The team key as a project stores it in Secrets Manager."""
        pem = self.private_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ).decode()
        return {"key_id": self.key_id, "issuer_id": self.issuer_id, "private_key": pem}

    def store_key(self, secretsmanager: Any, name: str) -> None:
        """The key under `name` (relevo/<stack>/_release/<project>/…), created or replaced."""
        value = json.dumps(self.key_secret())
        try:
            secretsmanager.create_secret(Name=name, SecretString=value)
        except secretsmanager.exceptions.ResourceExistsException:
            secretsmanager.put_secret_value(SecretId=name, SecretString=value)

    def agent_config(self, stapler: list[str] | None = None, via: str | None = None) -> str:
        """The `[release_endpoints]` table of an agent's TOML config that points at this service
        (`via`: the URL of a proxy that forwards to it, which the service is told to answer as)."""
        base = via or self.service.url
        if via is not None:
            port = urlsplit(via).port
            if port is None:
                raise ValueError(f"{via}: a proxy on this host names its port")
            self.service.answer_as(port)
        lines = [
            "[release_endpoints]",
            f'app_store_connect = "{base}"',
            f'notary = "{base}/notary/v2"',
            f'notary_upload = "{base}/s3"',
        ]
        if stapler:
            lines.append("stapler = [" + ", ".join(json.dumps(part) for part in stapler) + "]")
        return "\n".join(lines) + "\n"

    def stop(self) -> None:
        self.service.stop()


def start_local_apple(
    bundle_id: str = "com.acme.release-app",
    app_name: str = "Release App",
    timing: Timing = DEMO_TIMING,
    review_sec: float = DEMO_REVIEW_SEC,
) -> LocalApple:
    """The service started on the real clock with a new team key (ES256, as Apple's) and one app."""
    service = AppleService(now=lambda: datetime.now(UTC), timing=timing, review_sec=review_sec).start()
    private_key = ec.generate_private_key(ec.SECP256R1())
    key_id = secrets.token_hex(5).upper()
    issuer_id = str(uuid.uuid4())
    service.add_key(ApiKey(issuer_id, key_id, private_key.public_key()))
    app = service.connect.add_app(bundle_id, app_name)
    return LocalApple(service, key_id, issuer_id, private_key, app.id)
