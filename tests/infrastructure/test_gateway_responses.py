"""API Gateway's own refusals (GatewayResponses of template.yaml) are valid JSON on AWS, and the
local adapter renders them the way AWS does.

AWS, "Variables for data transformations for API Gateway": `$context.error.messageString` is "the
quoted value of `$context.error.message`", so a body template writes it bare; AWS's own example
(x-amazon-apigateway-gateway-responses.responseTemplates) is
`{"message": $context.error.messageString, ...}`. A template that puts quotes around it produces
`"message": ""...""` on AWS. Gateway response templates are simple variable substitution, not VTL.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from relevo_local.apigateway import ApiAdapter, Route
from relevo_local.sigv4 import Refusal
from relevo_local.template import gateway_responses, load_sam_template

ROOT = Path(__file__).resolve().parents[2]

# A message with everything JSON must escape: a quote, a backslash and a newline.
AWKWARD = 'The request signature we calculated does not match.\nThe Canonical String was "GET\\n/v1/jobs"'


@pytest.fixture(scope="module")
def responses() -> dict[str, tuple[int | None, str]]:
    found = gateway_responses(load_sam_template(ROOT / "template.yaml"))
    assert {"MISSING_AUTHENTICATION_TOKEN", "INVALID_SIGNATURE", "DEFAULT_4XX", "DEFAULT_5XX"} <= set(found)
    return found


@pytest.fixture()
def adapter(responses: dict[str, tuple[int | None, str]]) -> Iterator[ApiAdapter]:
    refusal = Refusal(AWKWARD, "INVALID_SIGNATURE")
    served = ApiAdapter(
        [Route.of("GET", "/jobs/{job_id}", True, "JobsFunction")],
        invoke=lambda name, event: pytest.fail("a refused request reached a function"),
        authenticate=lambda method, url, headers, body: refusal,
        stage="v1",
        api_id="local",
        account_id="123456789012",
        gateway_responses=responses,
    )
    yield served
    served.server.server_close()


def _render(
    adapter: ApiAdapter, response_type: str, status: int, message: str
) -> tuple[int, dict[str, str], Any]:
    code, headers, body = adapter._gateway_response(response_type, status, message)
    return code, headers, body.decode()


def test_the_adapter_substitutes_message_string_as_a_quoted_json_string() -> None:
    """The substitution itself, on a body written the way AWS's documentation writes it."""
    bare = {"DEFAULT_4XX": (None, '{"error": "X", "message": $context.error.messageString}')}
    adapter = ApiAdapter(
        [], lambda *_: None, lambda *_: Refusal("x"), "v1", "local", "123456789012", gateway_responses=bare
    )
    try:
        _, _, body = _render(adapter, "ACCESS_DENIED", 403, AWKWARD)
    finally:
        adapter.server.server_close()
    assert json.loads(body) == {"error": "X", "message": AWKWARD}


@pytest.mark.parametrize(
    "response_type",
    [
        "MISSING_AUTHENTICATION_TOKEN",
        "INVALID_SIGNATURE",
        "EXPIRED_TOKEN",
        "ACCESS_DENIED",
        "REQUEST_TOO_LARGE",
        "THROTTLED",
        "DEFAULT_4XX",
        "DEFAULT_5XX",
    ],
)
def test_every_gateway_response_of_the_template_renders_as_json(
    adapter: ApiAdapter, responses: dict[str, tuple[int | None, str]], response_type: str
) -> None:
    assert response_type in responses, f"template.yaml has no {response_type} gateway response"
    configured_status, template_body = responses[response_type]
    status = configured_status or (502 if response_type == "DEFAULT_5XX" else 400)

    code, headers, body = _render(adapter, response_type, status, AWKWARD)

    assert "$context" not in body, f"{response_type}: a variable the adapter does not render: {body}"
    try:
        parsed = json.loads(body)
    except json.JSONDecodeError as exc:
        pytest.fail(f"{response_type}: {exc}: {body!r} (template {template_body!r})")
    assert code == status and headers["Content-Type"] == "application/json"
    assert re.fullmatch(r"[A-Z_]+", parsed["error"]), parsed
    if "$context.error.messageString" in template_body:
        assert parsed["message"] == AWKWARD


def test_the_cli_shows_the_error_code_of_a_gateway_refusal(adapter: ApiAdapter) -> None:
    """The CLI reads `error` from API Gateway's own refusal too (here INVALID_SIGNATURE, whose AWS
    message quotes the canonical request)."""
    from relevo_cli.api import ApiError, RelevoApi

    adapter.start()
    try:
        session = boto3.session.Session(
            aws_access_key_id="AKIDEXAMPLE", aws_secret_access_key="secret", region_name="us-east-1"
        )
        api = RelevoApi(adapter.url, "us-east-1", session)
        with pytest.raises(ApiError) as refused:
            api.get_job("job_" + "0" * 26)
    finally:
        adapter.stop()
    assert refused.value.status == 403
    assert refused.value.code == "UNAUTHENTICATED", refused.value.body
    assert refused.value.body["message"] == AWKWARD
