"""GitHub's published REST description (npm package @octokit/openapi, generated/api.github.com.json),
pinned by version and integrity, fetched once by the setup step (`make .venv/.relevo-installed`
runs `python -m relevo_local.github.openapi`) and cached in the venv; and a check of one call
against it: the method and path are an operation of the description, the path parameters are
there, the body has the required fields, and every value with an enum is one of it.

A test that needs the description and finds none fails, naming what to run: it never skips.
"""

from __future__ import annotations

import json
import re
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any

from relevo_local.npm_package import VENV_SHARE, PinnedPackage, write_whole

PACKAGE = "@octokit/openapi"
VERSION = "23.0.2"
TARBALL = f"https://registry.npmjs.org/{PACKAGE}/-/openapi-{VERSION}.tgz"
# `npm view @octokit/openapi@23.0.2 dist.integrity`
INTEGRITY = "sha512-pV8M7L9GY23AybNvTmo2nyjmpmnt6+2sRE/tqr0ZLQcPS4lnw7u5eZGNmwRNkBC3D7gZXbFx5AHzLUVRBXGDhg=="
MEMBER = "package/generated/api.github.com.json"
CACHED = VENV_SHARE / f"octokit-openapi-{VERSION}" / "api.github.com.json"


class DescriptionMissing(AssertionError):
    pass


def fetch(target: Path = CACHED) -> Path:
    if target.exists():
        return target
    (content,) = PinnedPackage(PACKAGE, VERSION, TARBALL, INTEGRITY).members([MEMBER])
    return write_whole(target, content)


@lru_cache(maxsize=1)
def description() -> dict[str, Any]:
    if not CACHED.exists():
        raise DescriptionMissing(
            f"GitHub's REST description ({PACKAGE} {VERSION}) is not cached at {CACHED}: run "
            "`.venv/bin/python -m relevo_local.github.openapi` (or `make .venv/.relevo-installed`) with "
            "the npm "
            f"registry reachable"
        )
    loaded: dict[str, Any] = json.loads(CACHED.read_text())
    return loaded


def _resolve(node: Any, spec: dict[str, Any], depth: int = 0) -> Any:
    if depth > 20:
        return node
    if isinstance(node, dict):
        if "$ref" in node:
            target: Any = spec
            for part in node["$ref"].lstrip("#/").split("/"):
                target = target[part]
            return _resolve(target, spec, depth + 1)
        return {k: _resolve(v, spec, depth + 1) for k, v in node.items()}
    if isinstance(node, list):
        return [_resolve(v, spec, depth + 1) for v in node]
    return node


def _operation(method: str, path: str) -> tuple[str, dict[str, Any], dict[str, str]]:
    spec = description()
    for template, item in spec["paths"].items():
        pattern = "^" + re.sub(r"\\\{([a-z_]+)\\\}", r"(?P<\1>[^/]+)", re.escape(template)) + "$"
        found = re.match(pattern, path)
        if found and method.lower() in item:
            return template, _resolve(item[method.lower()], spec), found.groupdict()
    raise AssertionError(
        f"{method} {path} is no operation of GitHub's REST description ({PACKAGE} {VERSION})"
    )


def check_call(method: str, path: str, body: Any, query: dict[str, str] | None = None) -> str:
    """Raise AssertionError naming each way the call departs from the description; returns the
    operation id. With `query` (the call's query parameters), its required ones are checked too."""
    template, operation, values = _operation(method, path)
    problems = []
    for parameter in operation.get("parameters", []):
        if parameter.get("in") == "path" and parameter.get("required") and not values.get(parameter["name"]):
            problems.append(f"path parameter {parameter['name']} is missing")
        if query is not None and parameter.get("in") == "query":
            if parameter.get("required") and not query.get(parameter["name"]):
                problems.append(f"query parameter {parameter['name']} is missing")
            if parameter["name"] in query:
                problems += _check_value(
                    _typed(query[parameter["name"]], parameter.get("schema", {})),
                    parameter.get("schema", {}),
                    f"query.{parameter['name']}",
                )
    schema = operation.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
    if schema is not None:
        problems += _check_value(body, schema, "body")
    if problems:
        raise AssertionError(
            f"{method} {path} ({operation.get('operationId')}, {template}): " + "; ".join(problems)
        )
    return str(operation.get("operationId"))


# Answers GitHub gives to any operation, whether or not the operation lists them: bad credentials
# (401), no permission or a rate limit (403), a server's failure (5xx) -- each with GitHub's error
# body ("Troubleshooting the REST API", docs.github.com/rest/using-the-rest-api/troubleshooting-the-rest-api).
ANY_OPERATION = frozenset({401, 403, 500, 502, 503})


def check_answer(method: str, path: str, status: int, body: Any) -> list[str]:
    """Each way GitHub's answer `status` with `body` (parsed JSON, None for none) to the call
    departs from the description: a status the operation does not give, a body off its schema."""
    _, operation, _ = _operation(method, path)
    response = operation.get("responses", {}).get(str(status))
    if response is None:
        if status not in ANY_OPERATION:
            return [f"{method} {path}: {status} is no answer of {operation.get('operationId')}"]
        response = {
            "content": {"application/json": {"schema": description()["components"]["schemas"]["basic-error"]}}
        }
    schema = response.get("content", {}).get("application/json", {}).get("schema")
    if schema is None:
        return []
    return _check_value(body, _resolve(schema, description()), f"{status} answer")


def _typed(text: str, schema: dict[str, Any]) -> Any:
    """A query parameter's text as the type its schema names."""
    if schema.get("type") == "integer":
        try:
            return int(text)
        except ValueError:
            return text
    return text


def _check_value(value: Any, schema: dict[str, Any], where: str) -> list[str]:
    from openapi_schema_validator import OAS30Validator

    # The description is OpenAPI 3.0 (`nullable`): its own validator, the whole schema (types,
    # required fields, enums, lengths).
    return [
        f"{where}.{'.'.join(str(p) for p in error.path)}: {error.message}"
        for error in OAS30Validator(schema).iter_errors(value)
    ]


if __name__ == "__main__":
    print(fetch(), file=sys.stderr)
