"""boto3 clients, created on first use and reused for the life of the process.

Never built at import time: cold start stays cheap and tests can point AWS_ENDPOINT_URL at the
embedded stack before the first call. botocore itself honours AWS_ENDPOINT_URL.
"""

from __future__ import annotations

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


@lru_cache(maxsize=None)
def client(service: str) -> Any:
    # boto3's default session is not thread-safe while it creates clients.
    with _lock:
        return boto3.session.Session().client(service, config=_CLIENT_CONFIG)


def reset_clients() -> None:
    """Forget cached clients (after the endpoint or credentials change)."""
    client.cache_clear()
