"""ArtifactQuotaFunction (artifact.max_total_bytes) is least-privilege: in S3 it may only delete
objects of the artifact bucket; in DynamoDB it queries ProjectJobsIndex and the artifact records,
never scans; and it runs off the table stream, not from the agent's upload path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from relevo_local.template import load_sam_template

TEMPLATE = Path(__file__).resolve().parents[2] / "template.yaml"


def _statements(function: dict[str, Any]) -> list[dict[str, Any]]:
    return [statement for policy in function["Properties"]["Policies"] for statement in policy["Statement"]]


def _actions(statement: dict[str, Any]) -> list[str]:
    actions = statement["Action"]
    return actions if isinstance(actions, list) else [actions]


def test_the_quota_function_deletes_only_artifact_objects_and_never_scans() -> None:
    function = load_sam_template(TEMPLATE)["Resources"]["ArtifactQuotaFunction"]
    statements = _statements(function)
    s3 = [
        (action, statement["Resource"])
        for statement in statements
        for action in _actions(statement)
        if action.startswith("s3:")
    ]
    assert s3 == [("s3:DeleteObject", {"Fn::Sub": "${ArtifactBucket.Arn}/*"})]
    actions = {action for statement in statements for action in _actions(statement)}
    assert "dynamodb:Scan" not in actions and not any(action.endswith("*") for action in actions)
    index_queries = [
        statement["Resource"]
        for statement in statements
        if statement["Resource"] != {"Fn::GetAtt": ["Table", "Arn"]}
        and not str(statement["Resource"]).startswith("{'Fn::Sub': '${ArtifactBucket")
    ]
    assert index_queries == [{"Fn::Sub": "${Table.Arn}/index/ProjectJobsIndex"}]
    # Every table statement is held to the partitions it needs.
    for statement in statements:
        if statement["Resource"] == {"Fn::GetAtt": ["Table", "Arn"]}:
            assert statement["Condition"]["ForAllValues:StringLike"]["dynamodb:LeadingKeys"], statement


def test_the_quota_function_runs_off_the_table_stream() -> None:
    events = load_sam_template(TEMPLATE)["Resources"]["ArtifactQuotaFunction"]["Properties"]["Events"]
    assert [event["Type"] for event in events.values()] == ["DynamoDB"]
