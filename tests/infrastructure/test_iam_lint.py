"""The offline IAM lint (relevo_tools.iam_lint, part of `make lint`) passes template.yaml, and it is
real: each kind of mistake AWS would refuse or silently widen, added to the template, is reported.

The emulator cannot catch these: moto resolves IAM resources only for SQS, S3, IAM and STS, checks
DynamoDB and Step Functions as `*`, and ignores `ForAllValues:` conditions.
"""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from relevo_local.template import load_sam_template
from relevo_tools import iam_lint, iam_policies

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "template.yaml"


@pytest.fixture(scope="module")
def sam() -> dict[str, Any]:
    return load_sam_template(TEMPLATE)


@pytest.fixture(scope="module")
def baseline(sam: dict[str, Any]) -> iam_lint.Report:
    return _baseline_of(sam)


def _codes(report: iam_lint.Report) -> set[tuple[str, str, str]]:
    return {(f.owner, f.sid, f.code) for f in report.findings}


def _added(sam: dict[str, Any], owner: str, statement: dict[str, Any]) -> set[tuple[str, str, str]]:
    """What the lint reports once `statement` is added to `owner`'s policies."""
    broken = copy.deepcopy(sam)
    broken["Resources"][owner]["Properties"]["Policies"].append(
        {"Version": "2012-10-17", "Statement": [statement]}
    )
    return _codes(iam_lint.lint(broken, ROOT)) - _codes(_baseline_of(sam))


def _baseline_of(sam: dict[str, Any], _cache: dict[int, iam_lint.Report] = {}) -> iam_lint.Report:  # noqa: B006
    if id(sam) not in _cache:
        _cache[id(sam)] = iam_lint.lint(sam, ROOT)
    return _cache[id(sam)]


def _table_arn(suffix: str = "") -> dict[str, str]:
    return {"Fn::Sub": "${Table.Arn}" + suffix}


# ---------------------------------------------------------------- the template


def test_every_policy_of_the_template_passes(baseline: iam_lint.Report) -> None:
    problems = [f"{f.where()}: {f.code}: {f.message}" for f in baseline.findings] + baseline.errors
    assert problems == []


def test_every_kept_finding_is_suppressed_in_place_with_a_reason(baseline: iam_lint.Report) -> None:
    for finding, reason in baseline.suppressed:
        assert len(reason) > 30, f"{finding.where()} {finding.code}: the reason says too little: {reason!r}"


def test_the_lint_finds_every_role_and_policy_of_the_translated_template(
    sam: dict[str, Any], baseline: iam_lint.Report
) -> None:
    """Every SAM function and state machine (their generated roles), the scheduler role, and every
    resource policy the template declares: found by type, not by name."""
    owners = {(d.owner, d.kind) for d in baseline.documents}
    sam_owners = {
        name
        for name, r in sam["Resources"].items()
        if r["Type"] in ("AWS::Serverless::Function", "AWS::Serverless::StateMachine")
        and "Role" not in r["Properties"]
    }
    assert {(name, "trust") for name in sam_owners} <= owners
    # A function with a role of its own (Role: !GetAtt X.Arn): that role and its policies are linted.
    own_roles = {
        r["Properties"]["Role"]["Fn::GetAtt"][0]
        for r in sam["Resources"].values()
        if r["Type"] == "AWS::Serverless::Function" and "Role" in r["Properties"]
    }
    assert own_roles and {(name, "trust") for name in own_roles} <= owners
    with_policies = {name for name in sam_owners if sam["Resources"][name]["Properties"].get("Policies")}
    assert {(name, "identity") for name in with_policies} <= owners
    assert {
        ("SchedulerInvokeRole", "trust"),
        ("SchedulerInvokeRole", "identity"),
        ("ArtifactBucketPolicy", "resource"),
    } <= owners


def test_a_role_and_policies_added_later_are_linted_whatever_their_names(sam: dict[str, Any]) -> None:
    """The next agent policy (one per region affinity) will be an AWS::IAM::ManagedPolicy or a role:
    a new resource of each policy type is found and checked without the lint knowing its name."""
    broken = copy.deepcopy(sam)
    bad = {
        "Version": "2012-10-17",
        "Statement": [{"Sid": "Bad", "Effect": "Allow", "Action": "sqs:ReceiveMesage", "Resource": "*"}],
    }
    broken["Resources"]["AgentPolicyeuwest"] = {
        "Type": "AWS::IAM::ManagedPolicy",
        "Properties": {"PolicyDocument": bad},
    }
    broken["Resources"]["SomePolicy"] = {
        "Type": "AWS::IAM::Policy",
        "Properties": {
            "PolicyName": "some",
            "PolicyDocument": bad,
            "Roles": [{"Ref": "SchedulerInvokeRole"}],
        },
    }
    broken["Resources"]["SomeRole"] = {
        "Type": "AWS::IAM::Role",
        "Properties": {
            "AssumeRolePolicyDocument": {
                "Version": "2012-10-17",
                "Statement": [
                    {
                        "Effect": "Allow",
                        "Principal": {"Service": "lambda.amazonaws.com"},
                        "Action": "sts:AssumeRole",
                    }
                ],
            },
            "Policies": [{"PolicyName": "inline", "PolicyDocument": bad}],
        },
    }
    found = {(f.owner, f.code) for f in iam_lint.lint(broken, ROOT).findings}
    assert {
        ("AgentPolicyeuwest", "UNKNOWN_ACTION"),
        ("SomePolicy", "UNKNOWN_ACTION"),
        ("SomeRole", "UNKNOWN_ACTION"),
    } <= found


def test_foreach_expanded_resources_render_to_their_arns(sam: dict[str, Any]) -> None:
    expanded = load_sam_template(TEMPLATE, {"RegionAffinities": "eu-west,us-east,ap-south"})
    cfn, renderer = iam_policies.render(expanded, ROOT, {"RegionAffinities": "eu-west,us-east,ap-south"})
    assert (
        renderer.get_att("WorkQueueapsouth", "Arn")
        == "arn:aws:sqs:us-east-1:123456789012:relevo-work-ap-south"
    )
    assert renderer.value({"Fn::Sub": "${Table.Arn}/index/KindIndex"}) == (
        "arn:aws:dynamodb:us-east-1:123456789012:table/relevo-Table-1ABCDEFGHIJKL/index/KindIndex"
    )
    assert (
        renderer.ref("JobStateMachine")
        == "arn:aws:states:us-east-1:123456789012:stateMachine:relevo-JobStateMachine-1ABCDEFGHIJKL"
    )
    assert iam_lint.lint(expanded, ROOT, {"RegionAffinities": "eu-west,us-east,ap-south"}).findings == []


# ---------------------------------------------------------------- the lint is real


def test_finding_2_a_callback_answered_on_the_state_machine_arn_is_reported(sam: dict[str, Any]) -> None:
    """What template.yaml granted before issue 13: SendTaskSuccess / SendTaskFailure take no
    resource type in the Service Authorization Reference, so AWS needs Resource "*"."""
    added = _added(
        sam,
        "TriggersFunction",
        {
            "Sid": "AnswerOnTheMachine",
            "Effect": "Allow",
            "Action": ["states:SendTaskSuccess", "states:SendTaskFailure"],
            "Resource": {"Ref": "JobStateMachine"},
        },
    )
    assert {
        ("TriggersFunction", "AnswerOnTheMachine", "RESOURCE_FIT"),
        ("TriggersFunction", "AnswerOnTheMachine", "RESOURCE_MISMATCH"),
    } <= added


@pytest.mark.parametrize(
    ("action", "resource"),
    [
        ("sts:GetCallerIdentity", {"Fn::GetAtt": ["SchedulerInvokeRole", "Arn"]}),
        ("cloudwatch:PutMetricData", "arn:aws:cloudwatch:us-east-1:123456789012:alarm:x"),
        ("xray:PutTraceSegments", {"Ref": "JobStateMachine"}),
        ("states:SendTaskHeartbeat", {"Ref": "JobStateMachine"}),
    ],
)
def test_any_action_without_a_resource_type_must_be_granted_on_star(
    sam: dict[str, Any], action: str, resource: Any
) -> None:
    added = _added(
        sam, "JobsFunction", {"Sid": "Scoped", "Effect": "Allow", "Action": action, "Resource": resource}
    )
    assert ("JobsFunction", "Scoped", "RESOURCE_FIT") in added


def test_an_action_that_does_not_exist_is_reported(sam: dict[str, Any]) -> None:
    added = _added(
        sam,
        "TriggersFunction",
        {"Sid": "Typo", "Effect": "Allow", "Action": "states:SendTaskSucess", "Resource": "*"},
    )
    assert ("TriggersFunction", "Typo", "UNKNOWN_ACTION") in added


def test_star_on_an_action_that_takes_a_resource_type_is_reported(sam: dict[str, Any]) -> None:
    added = _added(
        sam,
        "SweeperFunction",
        {"Sid": "Wide", "Effect": "Allow", "Action": "sqs:SendMessage", "Resource": "*"},
    )
    assert ("SweeperFunction", "Wide", "RESOURCE_STAR") in added


def test_a_query_on_an_index_arn_without_index_is_reported(sam: dict[str, Any]) -> None:
    """`Query` on an index needs `table/T/index/I`; `table/T/I` is no resource type at all."""
    added = _added(
        sam,
        "JobsFunction",
        {
            "Sid": "NoIndexWord",
            "Effect": "Allow",
            "Action": "dynamodb:Query",
            "Resource": _table_arn("/KindIndex"),
        },
    )
    assert ("JobsFunction", "NoIndexWord", "RESOURCE_FIT") in added


def test_an_item_action_on_an_index_arn_is_reported(sam: dict[str, Any]) -> None:
    added = _added(
        sam,
        "JobsFunction",
        {
            "Sid": "ItemsOfAnIndex",
            "Effect": "Allow",
            "Action": "dynamodb:GetItem",
            "Resource": _table_arn("/index/KindIndex"),
        },
    )
    assert ("JobsFunction", "ItemsOfAnIndex", "RESOURCE_FIT") in added


def test_a_query_on_an_index_the_table_does_not_have_is_reported(sam: dict[str, Any]) -> None:
    added = _added(
        sam,
        "JobsFunction",
        {
            "Sid": "Renamed",
            "Effect": "Allow",
            "Action": "dynamodb:Query",
            "Resource": _table_arn("/index/KindsIndex"),
        },
    )
    assert ("JobsFunction", "Renamed", "UNKNOWN_INDEX") in added


def test_leading_keys_on_an_action_that_does_not_support_it_is_reported(sam: dict[str, Any]) -> None:
    """A condition key an action does not support is absent from its request, and ForAllValues
    over an absent key is true: the statement would grant the action unconditionally."""
    added = _added(
        sam,
        "SweeperFunction",
        {
            "Sid": "ScopedQueue",
            "Effect": "Allow",
            "Action": "sqs:SendMessage",
            "Resource": {"Fn::GetAtt": ["JobDeadLetterQueue", "Arn"]},
            "Condition": {"ForAllValues:StringLike": {"dynamodb:LeadingKeys": ["JOB#*"]}},
        },
    )
    assert ("SweeperFunction", "ScopedQueue", "UNKNOWN_CONDITION_FOR_ACTION") in added


def test_a_multivalued_key_without_a_set_operator_is_reported(sam: dict[str, Any]) -> None:
    added = _added(
        sam,
        "JobsFunction",
        {
            "Sid": "Unqualified",
            "Effect": "Allow",
            "Action": "dynamodb:GetItem",
            "Resource": _table_arn(),
            "Condition": {"StringLike": {"dynamodb:LeadingKeys": ["JOB#*"]}},
        },
    )
    assert ("JobsFunction", "Unqualified", "MULTIVALUED_KEY_WITHOUT_SET_OPERATOR") in added


@pytest.mark.parametrize("key", ["iam:PassedToService", "aws:SourceAccount"])
def test_a_set_operator_on_a_single_valued_key_is_reported(sam: dict[str, Any], key: str) -> None:
    added = _added(
        sam,
        "ProjectsFunction",
        {
            "Sid": "TooPermissive",
            "Effect": "Allow",
            "Action": "iam:PassRole",
            "Resource": {"Fn::GetAtt": ["SchedulerInvokeRole", "Arn"]},
            "Condition": {"ForAllValues:StringEquals": {key: "scheduler.amazonaws.com"}},
        },
    )
    assert ("ProjectsFunction", "TooPermissive", "SET_OPERATOR_ON_SINGLE_VALUED_KEY") in added


def test_an_operator_of_the_wrong_type_is_reported(sam: dict[str, Any]) -> None:
    added = _added(
        sam,
        "ProjectsFunction",
        {
            "Sid": "NumericService",
            "Effect": "Allow",
            "Action": "iam:PassRole",
            "Resource": {"Fn::GetAtt": ["SchedulerInvokeRole", "Arn"]},
            "Condition": {"NumericEquals": {"iam:PassedToService": "1"}},
        },
    )
    assert ("ProjectsFunction", "NumericService", "MISMATCHED_TYPE") in added


# ---------------------------------------------------------------- suppressions


def _with_suppression(sam: dict[str, Any], owner: str, entry: dict[str, str]) -> dict[str, Any]:
    changed = copy.deepcopy(sam)
    metadata = changed["Resources"][owner].setdefault("Metadata", {})
    metadata.setdefault("iam-lint", {}).setdefault("suppress", []).append(entry)
    return changed


def test_a_suppression_in_the_owners_metadata_keeps_a_finding_out(sam: dict[str, Any]) -> None:
    changed = _with_suppression(
        sam,
        "SweeperFunction",
        {"sid": "Wide", "finding": "RESOURCE_STAR", "reason": "a reason long enough to say why"},
    )
    changed["Resources"]["SweeperFunction"]["Properties"]["Policies"].append(
        {
            "Version": "2012-10-17",
            "Statement": [{"Sid": "Wide", "Effect": "Allow", "Action": "sqs:SendMessage", "Resource": "*"}],
        }
    )
    report = iam_lint.lint(changed, ROOT)
    assert ("SweeperFunction", "Wide", "RESOURCE_STAR") not in _codes(report)
    assert ("SweeperFunction", "Wide", "RESOURCE_STAR") in {
        (f.owner, f.sid, f.code) for f, _ in report.suppressed
    }


def test_a_suppression_without_a_reason_or_that_matches_nothing_is_an_error(sam: dict[str, Any]) -> None:
    no_reason = iam_lint.lint(
        _with_suppression(sam, "JobsFunction", {"sid": "ReadJobs", "finding": "RESOURCE_STAR"}), ROOT
    )
    stale = iam_lint.lint(
        _with_suppression(
            sam,
            "JobsFunction",
            {"sid": "ReadJobs", "finding": "RESOURCE_STAR", "reason": "nothing here any more"},
        ),
        ROOT,
    )
    assert any("gives no reason" in e for e in no_reason.errors)
    assert any("matches no finding" in e for e in stale.errors)


# ---------------------------------------------------------------- the command `make lint` runs


def _run_lint(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "relevo_tools.iam_lint", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


def test_the_command_passes_the_template() -> None:
    result = _run_lint(TEMPLATE)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 findings" in result.stdout


def test_the_command_names_file_line_and_statement_and_exits_1(tmp_path: Path) -> None:
    text = TEMPLATE.read_text()
    broken = text.replace("Action: states:StopExecution", "Action: states:StopExecutions", 1)
    assert broken != text
    (tmp_path / "template.yaml").write_text(broken)
    for folder in ("functions", "layers", "statemachines"):
        (tmp_path / folder).symlink_to(ROOT / folder)
    result = _run_lint(tmp_path / "template.yaml")
    assert result.returncode == 1, result.stdout + result.stderr
    [line] = [line for line in result.stdout.splitlines() if "UNKNOWN_ACTION" in line]
    line_number = int(line.split(":")[1])
    assert "Sid: StopCanceledJobs" in broken.splitlines()[line_number - 1]
    assert "TriggersFunction" in line and "StopCanceledJobs" in line
