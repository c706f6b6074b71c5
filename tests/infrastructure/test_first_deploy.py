"""A first `sam deploy` into a fresh account or region is not refused (finding 6).

- Lambda keeps 100 of an account's concurrency unreserved, and a new account's quota may be as
  low as 10 (AWS Lambda Developer Guide, "Lambda quotas" and "Configuring reserved concurrency"):
  any reservation can then be refused, so reserving is a mode, off by default.
- REST API access logging needs the account's API Gateway CloudWatch role in that region (API
  Gateway Developer Guide, "Set up CloudWatch logging for REST APIs"), which a fresh region does
  not have; AWS::ApiGateway::Account is one setting per account and region ("you should only have
  one AWS::ApiGateway::Account resource per region per account"), so the stack does not own it:
  access logging is off until the user opts in, once the role is set.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from relevo_local.template import load_sam_template
from relevo_tools import iam_policies

ROOT = Path(__file__).resolve().parents[2]
UNRESERVED_MINIMUM = 100  # Lambda's floor of unreserved concurrency per account and region

# Each function's reservation when the mode is on: the figures it had before the mode existed.
RESERVED_WHEN_ON = {
    "WebhookFunction": 50,
    "ProjectsFunction": 10,
    "OpenApiFunction": 5,
    "JobsFunction": 20,
    "JobOutputFunction": 20,
    "TriggersFunction": 20,
    # Every claim of every Mac goes through it (and each renewal of a job's credentials).
    "AgentSessionsFunction": 20,
    "QueueFunction": 10,
    "ScheduleTriggerFunction": 10,
    "SweeperFunction": 1,
    "StatusReporterFunction": 2,
    "GroupsFunction": 2,
    "ArtifactQuotaFunction": 2,
    "CacheEvictionFunction": 1,
}


def _rendered(parameters: dict[str, str] | None = None) -> tuple[dict[str, Any], iam_policies.Renderer]:
    sam = load_sam_template(ROOT / "template.yaml", parameters)
    return iam_policies.render(sam, ROOT, parameters)


def _reservations(parameters: dict[str, str] | None = None) -> dict[str, Any]:
    cfn, renderer = _rendered(parameters)
    return {
        name: renderer.value(resource["Properties"]).get("ReservedConcurrentExecutions")
        for name, resource in cfn["Resources"].items()
        if resource["Type"] == "AWS::Lambda::Function"
    }


def test_by_default_no_function_reserves_concurrency() -> None:
    reservations = _reservations()
    assert set(reservations) == set(RESERVED_WHEN_ON), (
        "a function was added or removed: give it a figure here"
    )
    assert {name: figure for name, figure in reservations.items() if figure is not None} == {}


def test_the_reserved_mode_gives_each_function_its_figure() -> None:
    reservations = _reservations({"ReservedConcurrency": "on"})
    assert reservations == RESERVED_WHEN_ON
    total = sum(RESERVED_WHEN_ON.values())
    # What docs/operations.md tells users: the mode needs a quota of at least this.
    assert f"{total + UNRESERVED_MINIMUM}" in (ROOT / "docs" / "operations.md").read_text()


def _stage(parameters: dict[str, str] | None = None) -> dict[str, Any]:
    cfn, renderer = _rendered(parameters)
    [stage] = [r for r in cfn["Resources"].values() if r["Type"] == "AWS::ApiGateway::Stage"]
    assert not any(r["Type"] == "AWS::ApiGateway::Account" for r in cfn["Resources"].values())
    return renderer.value(stage["Properties"])


def test_by_default_api_access_logging_is_off() -> None:
    assert "AccessLogSetting" not in _stage()


def test_access_logging_once_opted_in_writes_to_the_stacks_log_group() -> None:
    cfn, renderer = _rendered({"ApiAccessLogging": "on"})
    setting = _stage({"ApiAccessLogging": "on"})["AccessLogSetting"]
    assert setting["DestinationArn"] == renderer.get_att("ApiAccessLogGroup", "Arn")
    assert '"requestId":"$context.requestId"' in setting["Format"]
    assert renderer.exists("ApiAccessLogGroup")


@pytest.mark.parametrize("parameter", ["ReservedConcurrency", "ApiAccessLogging"])
def test_each_mode_is_a_two_valued_parameter_off_by_default(parameter: str) -> None:
    slot = load_sam_template(ROOT / "template.yaml")["Parameters"][parameter]
    assert slot["Default"] == "off" and slot["AllowedValues"] == ["off", "on"]
    assert parameter in (ROOT / "docs" / "operations.md").read_text()
