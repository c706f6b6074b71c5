"""The API against its own OpenAPI document: schemathesis generates requests from
GET /openapi.json and sends them, SigV4-signed, to the local stack's API.

No 5xx for any input, every response conforms to the document, and every 4xx carries a stable
error code. Project apply is left out of generation: a generated project that validates would
register schedules that keep firing for the rest of the session; its validation is covered by
the registry tests."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from relevo_cli.api import RelevoApi, SigV4RequestAuth
from relevo_core.models.errors import ErrorCode
from relevo_core.openapi import published_document

STABLE_CODES = {code.value for code in ErrorCode} | {"ROUTE_NOT_FOUND"}
pytestmark = pytest.mark.xdist_group("openapi-fuzz")


@pytest.fixture(scope="session")
def api_schema(local_stack):
    document = RelevoApi.for_stack(local_stack).request("GET", "/openapi.json")
    return schemathesis.openapi.from_dict(document).exclude(method="PUT", path="/projects/{project_id}")


schema = schemathesis.pytest.from_fixture("api_schema")


@pytest.fixture(scope="module")
def signed_by_the_test_principal(local_stack):
    # One boto3 session for every generated request: building one per request (its loaders and
    # handlers) was two fifths of this test's CPU.
    return SigV4RequestAuth(RelevoApi.for_stack(local_stack).session, local_stack.region)


def test_the_served_document_is_the_published_one(local_stack):
    import json

    assert RelevoApi.for_stack(local_stack).request("GET", "/openapi.json") == json.loads(
        published_document()
    )


# Every operation runs inside this one test (schemathesis subtests): a budget for all of them.
# Five examples per operation (derandomized, so every run sends the same ones): each is a Lambda
# invocation on the local stack, and eight made this the suite's longest test.
@pytest.mark.timeout(600)
@schema.parametrize()
@settings(max_examples=5, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_no_5xx_no_schema_violation_and_a_code_on_every_4xx(case, local_stack, signed_by_the_test_principal):
    response = case.call(base_url=local_stack.api_url, auth=signed_by_the_test_principal, timeout=30)
    case.validate_response(
        response,
        checks=[
            not_a_server_error,
            status_code_conformance,
            content_type_conformance,
            response_schema_conformance,
        ],
    )
    if 400 <= response.status_code < 500:
        body = response.json()
        assert body.get("error") in STABLE_CODES, (case.method, case.path, response.status_code, body)
