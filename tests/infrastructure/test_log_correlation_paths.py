"""Every API function takes its log correlation id from the job the request names: each enters
through `lambda_entry()`, whose default path is the job id of the path, else API Gateway's
request id."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

from relevo_core.observability import API_CORRELATION_PATH, lambda_entry, logger

ROOT = Path(__file__).resolve().parents[2]
API_HANDLERS = [
    p for p in sorted((ROOT / "functions").glob("*/handler.py")) if "APIGatewayRestResolver" in p.read_text()
]


@pytest.mark.parametrize("handler", API_HANDLERS, ids=lambda p: p.parent.name)
def test_api_functions_correlate_logs_by_job(handler: Path):
    [entry] = [
        n
        for n in ast.parse(handler.read_text()).body
        if isinstance(n, ast.FunctionDef) and n.name == "lambda_handler"
    ]
    [decorator] = entry.decorator_list
    # The default path, or the API path named; never another one.
    assert isinstance(decorator, ast.Call) and ast.unparse(decorator.func) == "lambda_entry"
    named = {k.arg: ast.unparse(k.value) for k in decorator.keywords}
    assert (
        not decorator.args
        and named.get("correlation_id_path", "API_CORRELATION_PATH") == "API_CORRELATION_PATH"
    )


@dataclass
class _Context:
    function_name: str = "relevo-TriggersFunction"
    memory_limit_in_mb: int = 512
    invoked_function_arn: str = "arn:aws:lambda:us-east-1:123456789012:function:relevo-TriggersFunction"
    aws_request_id: str = "req-1"


@pytest.mark.parametrize(
    ("event", "correlation"),
    [
        ({"pathParameters": {"job_id": "job_abc"}, "requestContext": {"requestId": "api-req"}}, "job_abc"),
        ({"pathParameters": None, "requestContext": {"requestId": "api-req"}}, "api-req"),
    ],
)
def test_the_entry_helper_correlates_on_the_job_else_the_request(event, correlation, monkeypatch):
    monkeypatch.setenv("POWERTOOLS_TRACE_DISABLED", "true")

    @lambda_entry()
    def handler(event, context):
        return logger.get_correlation_id()

    assert API_CORRELATION_PATH.startswith("pathParameters.job_id")
    assert handler(event, _Context()) == correlation
