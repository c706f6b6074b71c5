"""Webhook bodies as GitHub sends them."""

from __future__ import annotations

import json


def push_body(repo: str, commit: str, ref: str = "refs/heads/main", deleted: bool = False) -> bytes:
    return json.dumps(
        {
            "ref": ref,
            "before": "1" * 40,
            "after": "0" * 40 if deleted else commit,
            "deleted": deleted,
            "repository": {"full_name": repo},
            "pusher": {"name": "ci"},
        }
    ).encode()
