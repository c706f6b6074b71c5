"""boto3 clients, created on first use and reused for the life of the process.

Never built at import time: cold start stays cheap and tests can point AWS_ENDPOINT_URL at the
embedded stack before the first call. botocore itself honours AWS_ENDPOINT_URL. A client is
cached per endpoint, region and access key, so a process that points at a second stack (a CLI
call, an e2e module's own stack, each with credentials of its own) and back never keeps talking
to the one it left, nor with the credentials it used there.
"""

from __future__ import annotations

import os
import threading
from functools import lru_cache
from typing import Any

import boto3
from botocore.config import Config

_CLIENT_CONFIG = Config(
    retries={"mode": "standard", "max_attempts": 3},
    connect_timeout=3,
    read_timeout=25,  # above SQS long-poll waits of 20 s
)
_lock = threading.Lock()


def _environment() -> tuple[str | None, str | None, str | None]:
    return os.environ.get("AWS_ENDPOINT_URL"), os.environ.get("AWS_DEFAULT_REGION"), os.environ.get("AWS_ACCESS_KEY_ID")


def client(service: str) -> Any:
    return _client(service, *_environment())


@lru_cache(maxsize=None)
def _client(service: str, endpoint: str | None, region: str | None, access_key: str | None) -> Any:
    # The key carries the environment the client was built from; boto3 reads it again itself.
    # boto3 sessions are not thread-safe while they create clients: one lock for all creation.
    with _lock:
        return _session(access_key).client(service, config=_CLIENT_CONFIG)


@lru_cache(maxsize=4)
def _session(access_key: str | None) -> boto3.session.Session:
    """One session for every client of a set of credentials (a session keeps the credentials it
    resolved first): each session loads botocore's endpoint and retry data again, about 8 MB per
    client in an agent that keeps four (the agent's idle RSS budget)."""
    return boto3.session.Session()


def s3_presigner() -> Any:
    """An S3 client for presigned URLs: SigV4 always (S3 refuses other signatures for objects
    encrypted with KMS, as the artifact bucket's are), cached like the others."""
    return _presigner(*_environment())


@lru_cache(maxsize=None)
def _presigner(endpoint: str | None, region: str | None, access_key: str | None) -> Any:
    with _lock:
        return _session(access_key).client("s3", config=_CLIENT_CONFIG.merge(Config(signature_version="s3v4")))


def reset_clients() -> None:
    """Forget cached clients and their session (after credentials change)."""
    _client.cache_clear()
    _session.cache_clear()
    _presigner.cache_clear()
