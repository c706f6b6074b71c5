"""GitHub webhook signatures (X-Hub-Signature-256) and push payload reading."""

from __future__ import annotations

import hashlib
import hmac

import pytest

from relevo_core.intake.webhooks import github
from relevo_core.models.errors import ErrorCode, RelevoError

# GitHub's published test vector, from "Validating webhook deliveries":
# https://docs.github.com/en/webhooks/using-webhooks/validating-webhook-deliveries
SECRET = "It's a Secret to Everybody"
BODY = b"Hello, World!"
EXPECTED = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"


def assert_refused(secret: str, body: bytes, header: str | None) -> RelevoError:
    with pytest.raises(RelevoError) as caught:
        github.verify_signature(secret, body, header)
    assert caught.value.code is ErrorCode.SIGNATURE_INVALID
    assert caught.value.status == 401
    return caught.value


def test_sign_matches_githubs_published_test_vector() -> None:
    """Given GitHub's documented secret and payload, when signed, then the value is GitHub's."""
    assert github.sign(SECRET, BODY) == EXPECTED


def test_verify_accepts_githubs_published_test_vector() -> None:
    """Given GitHub's documented secret, payload and signature, when verified, then it passes."""
    github.verify_signature(SECRET, BODY, EXPECTED)


@pytest.mark.parametrize("position", [0, 6, len(BODY) - 1])
def test_one_byte_change_to_the_body_is_refused(position: int) -> None:
    """Given a body with one byte changed after signing, when verified, then SIGNATURE_INVALID."""
    tampered = bytearray(BODY)
    tampered[position] ^= 0x01
    assert_refused(SECRET, bytes(tampered), EXPECTED)


def test_appended_byte_is_refused() -> None:
    """Given the signed body with a trailing newline added, when verified, then SIGNATURE_INVALID."""
    assert_refused(SECRET, BODY + b"\n", EXPECTED)


def test_wrong_secret_is_refused() -> None:
    """Given a signature made with another secret, when verified, then SIGNATURE_INVALID."""
    assert_refused("It's a Secret to Nobody", BODY, EXPECTED)


@pytest.mark.parametrize("header", [None, ""])
def test_missing_header_is_refused(header: str | None) -> None:
    """Given no X-Hub-Signature-256 header, when verified, then SIGNATURE_INVALID."""
    error = assert_refused(SECRET, BODY, header)
    assert "missing" in error.message


def test_sha1_header_is_refused_even_if_correct() -> None:
    """Given a correct legacy sha1= signature, when verified, then SIGNATURE_INVALID: only sha256 counts."""
    sha1 = "sha1=" + hmac.new(SECRET.encode(), BODY, hashlib.sha1).hexdigest()
    assert_refused(SECRET, BODY, sha1)


@pytest.mark.parametrize(
    "header",
    [
        EXPECTED.upper(),  # "SHA256=" prefix and upper-case hex
        EXPECTED[:-1],  # truncated
        EXPECTED + "0",  # extended
        "sha256=",  # prefix only
        " " + EXPECTED,  # leading space
    ],
)
def test_malformed_sha256_headers_are_refused(header: str) -> None:
    """Given a header that is not exactly the expected value, when verified, then SIGNATURE_INVALID."""
    assert_refused(SECRET, BODY, header)


def test_verify_compares_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Given a spy on hmac.compare_digest, when a signature is verified, then the comparison goes
    through compare_digest (not ==)."""
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)  # verify.py compares through it
    github.verify_signature(SECRET, BODY, EXPECTED)
    assert calls == [(EXPECTED.encode(), EXPECTED.encode())]

    calls.clear()
    assert_refused("wrong", BODY, EXPECTED)
    assert len(calls) == 1


def push(**fields: object) -> github.PushEvent:
    payload: dict[str, object] = {
        "ref": "refs/heads/main",
        "before": "a" * 40,
        "after": "b" * 40,
        "repository": {"full_name": "acme/app", "private": True},
        "unrelated": {"ignored": True},
    }
    payload.update(fields)
    return github.PushEvent.model_validate(payload)


def test_ordinary_push_is_not_a_deletion() -> None:
    """Given a push with a real after sha, when read, then it is not a deletion and extras are ignored."""
    event = push()
    assert not event.is_deletion
    assert event.repository.full_name == "acme/app"


def test_push_with_zero_after_is_a_deletion() -> None:
    """Given a push whose after sha is all zeros, when read, then it is a deletion."""
    assert push(after="0" * 40).is_deletion


def test_push_marked_deleted_is_a_deletion() -> None:
    """Given a push with deleted=true, when read, then it is a deletion whatever `after` says."""
    assert push(deleted=True).is_deletion
