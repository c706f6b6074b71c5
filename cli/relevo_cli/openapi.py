"""Generate the API's OpenAPI document from the API functions' resolvers.

    .venv/bin/python -m relevo_cli.openapi [--check]

Writes layers/core/relevo_core/openapi.json (served by GET /openapi.json); --check exits 1 when
the file differs from what the code generates now.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
OUTPUT = ROOT / "layers" / "core" / "relevo_core" / "openapi.json"
# Functions whose resolvers serve API routes (the rest run on schedules and streams).
API_FUNCTIONS = (
    "webhook",
    "projects",
    "jobs",
    "triggers",
    "openapi",
    "queue",
    "job_output",
    "groups",
    "agent_sessions",
)
# Placeholder settings: the handlers validate their environment lazily, never at import.
PLACEHOLDER_ENV = {
    "TABLE_NAME": "relevo-Table",
    "STATE_MACHINE_ARN": "arn:aws:states:us-east-1:123456789012:stateMachine:relevo-job",
    "QUEUED_STATE_MACHINE_ARN": "arn:aws:states:us-east-1:123456789012:stateMachine:relevo-job-queued",
    "ARTIFACT_BUCKET": "relevo-artifacts",
    "WORK_QUEUE_PREFIX": "relevo-work-",
    "POWERTOOLS_TRACE_DISABLED": "true",
    "AWS_DEFAULT_REGION": os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
}


def resolvers() -> list[Any]:
    for name, value in PLACEHOLDER_ENV.items():
        os.environ.setdefault(name, value)
    apps = []
    for name in API_FUNCTIONS:
        spec = importlib.util.spec_from_file_location(
            f"relevo_api_{name}", ROOT / "functions" / name / "handler.py"
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        apps.append(module.app)
    return apps


def generate() -> str:
    from relevo_core.openapi import build_document, dumps

    return dumps(build_document(resolvers()))


def main(argv: list[str]) -> int:
    text = generate()
    if "--check" in argv:
        if not OUTPUT.exists() or OUTPUT.read_text(encoding="utf-8") != text:
            sys.stderr.write(f"{OUTPUT} is stale: run `python -m relevo_cli.openapi`\n")
            return 1
        return 0
    OUTPUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUTPUT.relative_to(ROOT)} ({len(text)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
