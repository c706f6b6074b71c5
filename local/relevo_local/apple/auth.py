"""The bearer token App Store Connect and the notary service accept (Apple's "Generating Tokens
for API Requests"): a JWT signed ES256 with a team key, its header naming the key (`kid`), its
claims the issuer (`iss`), `iat`, `exp` no more than 20 minutes ahead, and the audience
`appstoreconnect-v1`. Checked with PyJWT against the public keys the test registered; time from
the service's injected clock. A refused token answers 401 NOT_AUTHORIZED, as Apple does."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric.ec import EllipticCurvePublicKey

AUDIENCE = "appstoreconnect-v1"
LONGEST_SEC = 20 * 60


class Unauthorized(Exception):
    """Why a token was refused (for the test's eyes; the answer itself says only NOT_AUTHORIZED)."""


@dataclass(frozen=True)
class ApiKey:
    issuer: str
    key_id: str
    public_key: EllipticCurvePublicKey


class Keys:
    def __init__(self, now: Callable[[], datetime]) -> None:
        self.now = now
        self._keys: dict[tuple[str, str], ApiKey] = {}

    def add(self, key: ApiKey) -> None:
        self._keys[(key.issuer, key.key_id)] = key

    def revoke(self, issuer: str, key_id: str) -> None:
        self._keys.pop((issuer, key_id), None)

    def check(self, authorization: str | None) -> dict[str, Any]:
        scheme, _, token = (authorization or "").partition(" ")
        if scheme != "Bearer" or not token:
            raise Unauthorized("no bearer token")
        try:
            header = jwt.get_unverified_header(token)
            unverified = jwt.decode(token, options={"verify_signature": False})
        except jwt.PyJWTError as error:
            raise Unauthorized(f"not a JWT: {error}") from error
        if header.get("alg") != "ES256":
            raise Unauthorized(f"alg {header.get('alg')!r} is not ES256")
        key = self._keys.get((str(unverified.get("iss")), str(header.get("kid"))))
        if key is None:
            raise Unauthorized(f"no key {header.get('kid')!r} of issuer {unverified.get('iss')!r}")
        try:
            # Expiry is checked below against the injected clock, not the machine's.
            claims: dict[str, Any] = jwt.decode(
                token,
                key.public_key,
                algorithms=["ES256"],
                audience=AUDIENCE,
                issuer=key.issuer,
                options={"require": ["exp", "iss", "aud"], "verify_exp": False, "verify_iat": False},
            )
        except jwt.PyJWTError as error:
            raise Unauthorized(str(error)) from error
        now = self.now().timestamp()
        if claims["exp"] <= now:
            raise Unauthorized("the token has expired")
        if claims["exp"] - now > LONGEST_SEC:
            raise Unauthorized("the token expires more than 20 minutes ahead")
        if "iat" in claims and claims["iat"] > now + 60:
            raise Unauthorized("the token was issued in the future")
        return claims
