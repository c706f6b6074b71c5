"""A stack.json for tests that must find a stack but never reach it: every URL points at port 9
(discard), where nothing listens."""

from __future__ import annotations

import json
from pathlib import Path

UNREACHABLE = "http://127.0.0.1:9"


def unreachable_stack_file(directory: Path, regions: tuple[str, ...] = ("eu-west", "us-east")) -> Path:
    path = directory / "stack.json"
    path.write_text(
        json.dumps(
            {
                "api_url": f"{UNREACHABLE}/v1",
                "aws_endpoint": UNREACHABLE,
                "region": "us-east-1",
                "resources": {"Table": "relevo-table"},
                "work_queues": {region: f"{UNREACHABLE}/queue/{region}" for region in regions},
            }
        )
    )
    return path
