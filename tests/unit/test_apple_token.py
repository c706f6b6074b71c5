"""The bearer token of the Apple effects (relevo_agent.effects.apple_token, issue 44): made from
the team key as Secrets Manager keeps it, accepted by the check Apple's documentation describes
(the local service's, relevo_local.apple.auth), and a missing or malformed key refused as
EFFECT_REFUSED naming the field, never quoting the key."""

from __future__ import annotations

from datetime import UTC, datetime

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from relevo_agent.effects.apple_token import AUDIENCE, bearer_token
from relevo_agent.effects.kind import EffectFailed
from relevo_core.models.errors import ErrorClass
from relevo_local.apple.auth import ApiKey, Keys, Unauthorized
from tests.helpers.local_apple import ISSUER, KEY_ID

NOW = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)


def _pem(private_key) -> str:
    return private_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()


@pytest.fixture
def team():
    private_key = ec.generate_private_key(ec.SECP256R1())
    keys = Keys(lambda: NOW)
    keys.add(ApiKey(ISSUER, KEY_ID, private_key.public_key()))
    secret = {"key_id": KEY_ID, "issuer_id": ISSUER, "private_key": _pem(private_key), "note": "CI key"}
    return keys, secret


def test_the_token_is_one_apple_accepts_and_expires_within_twenty_minutes(team):
    keys, secret = team
    # When a token is made from the secret's JSON at the service's time
    token = bearer_token(secret, NOW.timestamp())

    # Then Apple's check accepts it: ES256, its kid, its issuer, the audience
    claims = keys.check(f"Bearer {token}")
    assert jwt.get_unverified_header(token) == {"alg": "ES256", "kid": KEY_ID, "typ": "JWT"}
    assert (claims["iss"], claims["aud"], claims["iat"]) == (ISSUER, AUDIENCE, int(NOW.timestamp()))
    assert 0 < claims["exp"] - NOW.timestamp() <= 20 * 60
    # And twenty minutes on it is expired, as Apple would say
    keys.now = lambda: datetime.fromtimestamp(NOW.timestamp() + 20 * 60, UTC)
    with pytest.raises(Unauthorized, match="expired"):
        keys.check(f"Bearer {token}")


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"key_id": None}, "key_id"),
        ({"issuer_id": "not-a-uuid"}, "issuer_id"),
        ({"private_key": "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"}, "private_key"),
        ({"private_key": None}, "private_key"),
    ],
)
def test_a_malformed_key_is_refused_naming_the_field_and_never_quoting_the_key(team, change, named):
    _, secret = team
    # Given the secret with one field missing or wrong
    broken = {k: v for k, v in {**secret, **change}.items() if v is not None}

    # When a token is asked for
    with pytest.raises(EffectFailed) as refused:
        bearer_token(broken, NOW.timestamp())

    # Then it is refused before any request, naming the field, with no part of the key in it
    assert refused.value.error_class is ErrorClass.EFFECT_REFUSED
    assert named in refused.value.message
    assert "key_id, issuer_id and private_key" in refused.value.message
    assert "BEGIN" not in refused.value.message and "AAAA" not in refused.value.message
    assert secret["private_key"].splitlines()[1][:16] not in refused.value.message


def test_a_key_that_is_not_p256_or_not_an_object_is_refused(team):
    _, secret = team
    # Given an RSA key where a .p8 (EC P-256) belongs, and a secret that is a JSON list
    rsa_pem = _pem(rsa.generate_private_key(public_exponent=65537, key_size=2048))

    # Then each is refused, saying why
    with pytest.raises(EffectFailed, match="not an EC P-256 key") as refused:
        bearer_token({**secret, "private_key": rsa_pem}, NOW.timestamp())
    assert refused.value.error_class is ErrorClass.EFFECT_REFUSED
    with pytest.raises(EffectFailed, match="not a JSON object"):
        bearer_token(["key"], NOW.timestamp())  # type: ignore[arg-type]  # not a dict: the refusal is the test
