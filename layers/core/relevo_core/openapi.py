"""The API's OpenAPI document, assembled from every API function's Powertools resolver.

Each function has its own resolver (one Lambda per area), so Powertools' generator is run on each
and the paths are merged. The handlers read their bodies and query strings through pydantic
models in the core package rather than through Powertools' parameter injection, so those models
are attached here to the operations that take them, and every operation documents the error
body that all refusals share. The document is generated into `openapi.json` beside this module
(`python -m relevo_cli.openapi`); a test fails when it no longer matches the code.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from importlib import resources
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import JsonSchemaMode

from relevo_core.models.agent_session import ClaimGranted, ClaimRequest, SessionGranted, SessionRequest
from relevo_core.models.errors import ErrorCode
from relevo_core.models.job_view import JobView
from relevo_core.models.project import Project
from relevo_core.models.requests import (
    ApprovalDecision,
    ArtifactQuery,
    JobListQuery,
    JobTestsQuery,
    LogQuery,
    PauseRequest,
    PriorityRequest,
    RerunRequest,
    RunRequest,
)

TITLE = "Relevo"
VERSION = "1"
DOCUMENT_FILE = "openapi.json"


class ErrorBody(BaseModel):
    """What every refusal carries: a stable code and a sentence for people."""

    model_config = ConfigDict(extra="allow")

    error: ErrorCode | str = Field(description="stable error code (ErrorCode), or ROUTE_NOT_FOUND")
    message: str


class ProjectInput(Project):
    """A project as applied: the id comes from the path."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", json_schema_extra={"required": ["repo", "region_affinity", "stages"]}
    )


# (method, path) → the model its JSON body is validated with.
REQUEST_BODIES: dict[tuple[str, str], type[BaseModel]] = {
    ("put", "/projects/{project_id}"): ProjectInput,
    ("post", "/projects/{project_id}/run"): RunRequest,
    ("post", "/jobs/{job_id}/rerun"): RerunRequest,
    ("post", "/jobs/{job_id}/approve"): ApprovalDecision,
    ("post", "/jobs/{job_id}/reject"): ApprovalDecision,
    ("post", "/jobs/{job_id}/priority"): PriorityRequest,
    ("post", "/agents/{agent_id}/pause"): PauseRequest,
    ("post", "/regions/{region}/pause"): PauseRequest,
    ("post", "/regions/{region}/claims"): ClaimRequest,
    ("post", "/regions/{region}/sessions"): SessionRequest,
}
# (method, path) → the model its query string is validated with.
QUERY_MODELS: dict[tuple[str, str], type[BaseModel]] = {
    ("get", "/jobs"): JobListQuery,
    ("get", "/jobs/{job_id}/logs"): LogQuery,
    ("get", "/jobs/{job_id}/artifacts/{name}"): ArtifactQuery,
    ("get", "/jobs/{job_id}/tests"): JobTestsQuery,
}
# (method, path) → the model its 200 answer is.
RESPONSE_BODIES: dict[tuple[str, str], type[BaseModel]] = {
    ("get", "/jobs/{job_id}"): JobView,
    ("post", "/regions/{region}/claims"): ClaimGranted,
    ("post", "/regions/{region}/sessions"): SessionGranted,
}
# Refusals any operation may give (the API's own and API Gateway's IAM check).
COMMON_ERRORS = {
    "400": "malformed request",
    "401": "not authenticated, or a webhook signature that does not verify",
    "403": "the caller lacks the permission this route needs",
    "404": "no such project, job, artifact, agent or route",
    "409": "the target is not in a state that allows this (a claim of an attempt that is not free: "
    "CLAIM_REFUSED)",
    "410": "the artifact was removed by the project's artifact.max_total_bytes (ARTIFACT_REMOVED)",
    "413": "body over 1 MiB",
    "422": "a field fails validation, or a plan is over a limit of what a job can carry (PLAN_TOO_LARGE)",
    "429": "the queue is full",
    "503": "a secret the project names cannot be read",
}


def _schema_ref(
    model: type[BaseModel], schemas: dict[str, Any], mode: JsonSchemaMode = "validation"
) -> dict[str, str]:
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}", mode=mode)
    for name, definition in schema.pop("$defs", {}).items():
        schemas.setdefault(name, definition)
    schemas[model.__name__] = schema
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def _without_null(prop: dict[str, Any]) -> dict[str, Any]:
    """An optional query parameter is absent, never `null`: keep the non-null branch."""
    variants = [v for v in prop.get("anyOf", []) if v.get("type") != "null"]
    rest = {k: v for k, v in prop.items() if k not in ("title", "anyOf", "default")}
    if len(variants) == 1:
        return {**rest, **variants[0]}
    return {**rest, "anyOf": variants} if variants else rest


def _query_parameters(model: type[BaseModel], schemas: dict[str, Any]) -> list[dict[str, Any]]:
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}", mode="validation")
    for name, definition in schema.pop("$defs", {}).items():
        schemas.setdefault(name, definition)
    required = set(schema.get("required", []))
    return [
        {"name": name, "in": "query", "required": name in required, "schema": _without_null(prop)}
        for name, prop in schema.get("properties", {}).items()
    ]


def build_document(apps: Iterable[Any], server_url: str = "/") -> dict[str, Any]:
    """Merge the resolvers' generated paths into one document with bodies, queries and errors."""
    document: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {
            "title": TITLE,
            "version": VERSION,
            "description": "Relevo's API (SigV4 for every route but webhooks).",
        },
        "servers": [{"url": server_url}],
        "paths": {},
        "components": {"schemas": {}},
    }
    schemas = document["components"]["schemas"]
    error_ref = _schema_ref(ErrorBody, schemas)
    for app in apps:
        generated = app.get_openapi_schema(title=TITLE, version=VERSION).model_dump(
            mode="json", by_alias=True, exclude_none=True
        )
        for path, operations in generated.get("paths", {}).items():
            for method, operation in operations.items():
                operation.setdefault("responses", {})
                for status, description in COMMON_ERRORS.items():
                    operation["responses"][status] = {
                        "description": description,
                        "content": {"application/json": {"schema": error_ref}},
                    }
                # Powertools documents its own validation body for 422; Relevo answers with ErrorBody.
                if (method, path) in REQUEST_BODIES:
                    operation["requestBody"] = {
                        "required": False,
                        "content": {
                            "application/json": {
                                "schema": _schema_ref(REQUEST_BODIES[(method, path)], schemas)
                            }
                        },
                    }
                answer = RESPONSE_BODIES.get((method, path))
                if answer is not None:
                    operation["responses"]["200"] = {
                        "description": "Successful Response",
                        "content": {
                            "application/json": {"schema": _schema_ref(answer, schemas, mode="serialization")}
                        },
                    }
                if (method, path) in QUERY_MODELS:
                    operation.setdefault("parameters", []).extend(
                        _query_parameters(QUERY_MODELS[(method, path)], schemas)
                    )
                document["paths"].setdefault(path, {})[method] = operation
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    document["paths"] = dict(sorted(document["paths"].items()))
    return document


def published_document() -> str:
    """The generated document shipped with the core package."""
    return resources.files("relevo_core").joinpath(DOCUMENT_FILE).read_text(encoding="utf-8")


def dumps(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=2, sort_keys=False) + "\n"
