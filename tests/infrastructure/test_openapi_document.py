"""The published OpenAPI document matches the code and the template's routes."""

from __future__ import annotations

import json
from pathlib import Path

from relevo_cli.openapi import OUTPUT, generate
from relevo_core.openapi import QUERY_MODELS, REQUEST_BODIES
from relevo_local import template

ROOT = Path(__file__).resolve().parents[2]


def test_the_published_document_is_what_the_resolvers_generate():
    assert OUTPUT.read_text(encoding="utf-8") == generate(), (
        "stale: run `.venv/bin/python -m relevo_cli.openapi`"
    )


def test_every_template_route_is_documented_and_nothing_else():
    sam = template.load_sam_template(ROOT / "template.yaml")
    routes = {(m.lower(), p) for fn in template.sam_functions(sam, ROOT) for m, p, _ in fn.routes}
    document = json.loads(OUTPUT.read_text(encoding="utf-8"))
    documented = {(method, path) for path, ops in document["paths"].items() for method in ops}
    assert documented == routes
    assert set(REQUEST_BODIES) | set(QUERY_MODELS) <= documented


def test_every_refusal_is_documented_with_the_error_body():
    document = json.loads(OUTPUT.read_text(encoding="utf-8"))
    for path, ops in document["paths"].items():
        for method, op in ops.items():
            for status in ("400", "401", "403", "404", "422"):
                schema = op["responses"][status]["content"]["application/json"]["schema"]
                assert schema == {"$ref": "#/components/schemas/ErrorBody"}, (method, path, status)


def test_a_jobs_answer_is_documented_with_each_attempts_transfer():
    """Issue 18: GET /jobs/{id} documents its answer, each stage's transfer progress included."""
    document = json.loads(OUTPUT.read_text(encoding="utf-8"))
    answer = document["paths"]["/jobs/{job_id}"]["get"]["responses"]["200"]["content"]["application/json"][
        "schema"
    ]
    assert answer == {"$ref": "#/components/schemas/JobView"}
    schemas = document["components"]["schemas"]
    stage = schemas["StageView"]["properties"]
    assert stage["transfers"]["items"] == {"$ref": "#/components/schemas/TransferProgress"}
    assert {"$ref": "#/components/schemas/TransferProgress"} in stage["transfer"]["anyOf"]
    assert {
        "files_done",
        "files_total",
        "bytes_done",
        "bytes_total",
        "current_file",
        "updated_at",
        "state",
        "attempt",
    } <= set(schemas["TransferProgress"]["properties"])
