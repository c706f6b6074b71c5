"""The bearer token App Store Connect and the Notary API accept, made from a team key as the
project keeps it in Secrets Manager: a JSON object {key_id, issuer_id, private_key} (private_key
the .p8's PEM text). Apple's "Generating Tokens for API Requests": ES256, the header naming the
key (`kid`), the claims the issuer (`iss`), `iat`, `exp` at most 20 minutes ahead and the audience
`appstoreconnect-v1`.

A missing or malformed key is EFFECT_REFUSED before any request; its message names the field that
is wrong, never the key's text."""

from __future__ import annotations

from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_pem_private_key
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from relevo_agent.effects.kind import EffectFailed
from relevo_core.models.errors import ErrorClass

AUDIENCE = "appstoreconnect-v1"
# Apple refuses a token whose exp is more than 20 minutes after iat: a margin under it, so a clock
# a little ahead of Apple's does not make the token "too long".
LIFETIME_SEC = 19 * 60


class TeamKey(BaseModel):
    """A team (or individual) API key of App Store Connect, as the project stores it."""

    # Other fields a person keeps beside the key (a name, a note) are theirs: ignored.
    model_config = ConfigDict(extra="ignore", frozen=True, hide_input_in_errors=True)

    key_id: str = Field(pattern=r"^[A-Z0-9]{8,16}$", description="The key's id, as in AuthKey_<key_id>.p8.")
    issuer_id: str = Field(
        pattern=r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$",
        description="The team's issuer id (Users and Access > Integrations).",
    )
    private_key: str = Field(description="The .p8 file's PEM text: an EC P-256 private key.")

    @field_validator("private_key")
    @classmethod
    def _p256_pem(cls, value: str) -> str:
        try:
            key = load_pem_private_key(value.encode(), password=None)
        except (ValueError, TypeError) as error:
            # The error of cryptography never quotes the key; still, only its kind is said.
            raise ValueError("is not the PEM text of an unencrypted private key (.p8)") from error
        if not isinstance(key, ec.EllipticCurvePrivateKey) or not isinstance(key.curve, ec.SECP256R1):
            raise ValueError("is not an EC P-256 key (App Store Connect keys are ES256)")
        return value


def team_key(key: dict[str, Any], where: str = "the API key") -> TeamKey:
    """The key read from its secret's JSON, or EFFECT_REFUSED naming what is missing or wrong."""
    if not isinstance(key, dict):
        raise EffectFailed(ErrorClass.EFFECT_REFUSED, f"{where} is not a JSON object")
    try:
        return TeamKey.model_validate(key)
    except ValidationError as error:
        # Field names and reasons only: an error's input would be the key's own text.
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'the key'}: {e['msg'].removeprefix('Value error, ')}"
            for e in error.errors(include_input=False, include_url=False)
        )
        raise EffectFailed(
            ErrorClass.EFFECT_REFUSED,
            f"{where} is malformed ({problems}); it must be a JSON object with key_id, issuer_id "
            "and private_key (the .p8's PEM text)",
        ) from None


def bearer_token(key: dict[str, Any], now: float) -> str:
    """A token signed with `key` (the secret's JSON), issued at `now` (wall-clock seconds)."""
    valid = team_key(key)
    claims = {"iss": valid.issuer_id, "iat": int(now), "exp": int(now) + LIFETIME_SEC, "aud": AUDIENCE}
    return jwt.encode(
        claims, valid.private_key, algorithm="ES256", headers={"kid": valid.key_id, "typ": "JWT"}
    )
