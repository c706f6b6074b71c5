"""Properties of template.yaml and of the local deployment's handling of it, checked without AWS."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from relevo_local import deferred
from relevo_local.template import asl_placeholders, load_sam_template

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "template.yaml"

# Statements allowed Resource "*", each because its actions support no resource-level
# permissions: the Sid names why, and the actions must stay within that service. (The IAM lint,
# test_iam_lint.py, checks every action against AWS's catalogue.)
WILDCARD_RESOURCE_SIDS = {
    ("JobStateMachine", "DeliverExecutionLogs"): "logs:",  # CloudWatch Logs log-delivery actions
    ("JobStateMachine", "Tracing"): "xray:",  # X-Ray actions
    ("TriggersFunction", "AnswerApprovalGates"): "states:SendTask",  # callback answers
    # An email subscription's filter policy and its removal: these take no resource-level
    # permission (Service Authorization Reference, Amazon SNS).
    ("GroupsFunction", "ChangeGroupEmailSubscriptions"): (
        "sns:GetSubscriptionAttributes",
        "sns:SetSubscriptionAttributes",
        "sns:Unsubscribe",
    ),
}
# The same for any owner: waking the head of a project's line answers a task token, and
# states:SendTaskSuccess takes no resource-level permission (Service Authorization Reference).
WILDCARD_RESOURCE_SIDS_ANY_OWNER = {"WakeNextWaitingJob": "states:SendTaskSuccess"}


@pytest.fixture(scope="module")
def template() -> dict[str, Any]:
    return load_sam_template(TEMPLATE)


def _of_type(template: dict[str, Any], kind: str) -> dict[str, dict[str, Any]]:
    return {name: r for name, r in template["Resources"].items() if r["Type"] == kind}


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


# ---------------------------------------------------------------- state machine


JOB_MACHINES = {
    "JobStateMachine": "statemachines/job_run.asl.json",
    "JobQueuedStateMachine": "statemachines/job.asl.json",
}


@pytest.mark.parametrize("logical_id", sorted(JOB_MACHINES))
def test_asl_placeholders_match_definition_substitutions(template: dict[str, Any], logical_id: str) -> None:
    """Every ${...} of a job definition is a DefinitionSubstitutions key of its machine, and every
    key is used: an unmatched placeholder would reach Step Functions verbatim."""
    machine = template["Resources"][logical_id]["Properties"]
    assert machine["DefinitionUri"] == JOB_MACHINES[logical_id]
    placeholders = asl_placeholders((ROOT / machine["DefinitionUri"]).read_text())
    assert placeholders, "the definition has no ${...} placeholders at all; is asl_placeholders broken?"
    assert placeholders == set(machine["DefinitionSubstitutions"])


def test_both_job_machines_run_as_one_role(template: dict[str, Any]) -> None:
    """The queued machine runs as the role SAM makes for JobStateMachine, whose policies the
    test below holds to everything job.asl.json (the larger definition) calls."""
    queued = template["Resources"]["JobQueuedStateMachine"]["Properties"]
    assert queued["Role"] == {"Fn::GetAtt": ["JobStateMachineRole", "Arn"]}
    assert "Policies" not in queued


@pytest.mark.parametrize("logical_id", sorted(JOB_MACHINES))
def test_definition_substitutions_name_resources_of_the_template(
    template: dict[str, Any], logical_id: str
) -> None:
    substitutions = template["Resources"][logical_id]["Properties"]["DefinitionSubstitutions"]
    for key, value in substitutions.items():
        assert isinstance(value, dict) and len(value) == 1, f"{key}: {value!r} is not a single intrinsic"
        ((function, argument),) = value.items()
        target = argument if function == "Ref" else _as_list(argument)[0].split(".")[0]
        assert function in {"Ref", "Fn::GetAtt"} and target in template["Resources"], f"{key}: {value!r}"


# ---------------------------------------------------------------- Fn::ForEach


def test_foreach_expands_one_queue_dlq_and_alarm_per_region_affinity() -> None:
    expanded = load_sam_template(TEMPLATE, {"RegionAffinities": "eu-west,us-east,ap-south"})
    resources = expanded["Resources"]
    assert not any(name.startswith("Fn::ForEach") for name in resources)
    per_region = {
        name for name in resources if re.match(r"^(WorkQueue|WorkDeadLetterQueue|WorkQueueAgeAlarm)", name)
    }
    suffixes = {"eu-west": "euwest", "us-east": "useast", "ap-south": "apsouth"}
    assert per_region == {
        f"{prefix}{suffix}"
        for prefix in ("WorkQueue", "WorkDeadLetterQueue", "WorkQueueAgeAlarm")
        for suffix in suffixes.values()
    }
    for region, suffix in suffixes.items():
        queue = resources[f"WorkQueue{suffix}"]
        dlq = resources[f"WorkDeadLetterQueue{suffix}"]
        alarm = resources[f"WorkQueueAgeAlarm{suffix}"]
        assert (queue["Type"], dlq["Type"], alarm["Type"]) == (
            "AWS::SQS::Queue",
            "AWS::SQS::Queue",
            "AWS::CloudWatch::Alarm",
        )
        # Queue names are what the webhook resolves through WORK_QUEUE_PREFIX.
        assert queue["Properties"]["QueueName"] == {"Fn::Sub": f"${{AWS::StackName}}-work-{region}"}
        assert dlq["Properties"]["QueueName"] == {"Fn::Sub": f"${{AWS::StackName}}-work-{region}-dlq"}
        redrive = queue["Properties"]["RedrivePolicy"]["deadLetterTargetArn"]
        assert redrive == {"Fn::GetAtt": [f"WorkDeadLetterQueue{suffix}", "Arn"]}
        dimension = alarm["Properties"]["Dimensions"][0]["Value"]
        assert dimension == {"Fn::GetAtt": [f"WorkQueue{suffix}", "QueueName"]}


def test_every_region_affinity_has_a_zero_online_agents_alarm_on_the_sweepers_count() -> None:
    expanded = load_sam_template(TEMPLATE, {"RegionAffinities": "eu-west,us-east,ap-south"})
    resources = expanded["Resources"]
    alarms = {name: r for name, r in resources.items() if name.startswith("OnlineAgentsAlarm")}
    assert set(alarms) == {"OnlineAgentsAlarmeuwest", "OnlineAgentsAlarmuseast", "OnlineAgentsAlarmapsouth"}
    for region in ("eu-west", "us-east", "ap-south"):
        props = alarms[f"OnlineAgentsAlarm{region.replace('-', '')}"]["Properties"]
        # What functions/sweeper prints: Relevo/OnlineAgents by Region (and Powertools' service).
        assert (props["Namespace"], props["MetricName"]) == ("Relevo", "OnlineAgents")
        assert props["Dimensions"] == [
            {"Name": "Region", "Value": region},
            {"Name": "service", "Value": "relevo"},
        ]
        assert (props["ComparisonOperator"], props["Threshold"]) == ("LessThanThreshold", 1)
        # A sweeper that stopped counting is as alarming as an empty fleet.
        assert props["TreatMissingData"] == "breaching"
        assert props["AlarmActions"] == [{"Ref": "NotificationTopic"}]
    sweeper = resources["SweeperFunction"]["Properties"]
    assert sweeper["Environment"]["Variables"]["REGION_AFFINITIES"] == {
        "Fn::Join": [",", {"Ref": "RegionAffinities"}]
    }
    dashboard = json.dumps(resources["Dashboard"]["Properties"]["DashboardBody"])
    assert "MIN(OnlineAgents) FROM SCHEMA(Relevo, Region, service)" in dashboard


def test_the_dashboard_shows_every_webhook_answer_the_intake_counts(template: dict[str, Any]) -> None:
    """Each metric relevo_core.intake.webhooks.incoming emits, and the refusals by their reason."""
    from relevo_core.intake.webhooks import incoming

    dashboard = json.dumps(template["Resources"]["Dashboard"]["Properties"]["DashboardBody"])
    for metric in (incoming.ACCEPTED, incoming.DUPLICATE, incoming.IGNORED, incoming.REFUSED):
        assert f'\\"Relevo\\", \\"{metric}\\", \\"service\\", \\"relevo\\"' in dashboard, metric
    assert f"SUM({incoming.REFUSED}) FROM SCHEMA(Relevo, Reason, service)" in dashboard


def test_the_dashboard_shows_each_projects_cache_hit_ratio_beside_the_handoff_latency(
    template: dict[str, Any],
) -> None:
    """CacheHitRatio (relevo_core.jobs.metrics), printed per project with the service dimension."""
    dashboard = json.dumps(template["Resources"]["Dashboard"]["Properties"]["DashboardBody"])
    assert '\\"HandoffLatencyMs\\"' in dashboard
    assert "AVG(CacheHitRatio) FROM SCHEMA(Relevo, Project, service)" in dashboard
    assert "GROUP BY Project" in dashboard


# ---------------------------------------------------------------- retention


def test_retention_is_three_parameters_expired_by_dynamodb_ttl_and_an_s3_lifecycle_rule(
    template: dict[str, Any],
) -> None:
    parameters = template["Parameters"]
    defaults = {
        name: parameters[name]["Default"]
        for name in ("JobRetentionDays", "LogRetentionDays", "ArtifactRetentionDays")
    }
    assert defaults == {"JobRetentionDays": 30, "LogRetentionDays": 14, "ArtifactRetentionDays": 30}
    assert all(
        parameters[name]["Type"] == "Number" and parameters[name]["MinValue"] == 1 for name in defaults
    )
    # Jobs and log chunks: intake freezes both into the envelope from its environment...
    variables = template["Globals"]["Function"]["Environment"]["Variables"]
    assert variables["JOB_RETENTION_DAYS"] == {"Ref": "JobRetentionDays"}
    assert variables["LOG_RETENTION_DAYS"] == {"Ref": "LogRetentionDays"}
    # ...and DynamoDB expires them (and artifact records) by the attribute every store writes.
    assert template["Resources"]["Table"]["Properties"]["TimeToLiveSpecification"] == {
        "AttributeName": "ttl",
        "Enabled": True,
    }
    # Artifact objects: the bucket's lifecycle rule, old versions and stalled uploads included.
    [rule] = template["Resources"]["ArtifactBucket"]["Properties"]["LifecycleConfiguration"]["Rules"]
    assert rule["Status"] == "Enabled" and "Prefix" not in rule and "Filter" not in rule  # the whole bucket
    assert rule["ExpirationInDays"] == {"Ref": "ArtifactRetentionDays"}
    assert rule["NoncurrentVersionExpiration"] == {"NoncurrentDays": 1}
    assert rule["AbortIncompleteMultipartUpload"] == {"DaysAfterInitiation": 1}


def test_foreach_default_regions(template: dict[str, Any]) -> None:
    queues = {name for name in _of_type(template, "AWS::SQS::Queue") if name.startswith("WorkQueue")}
    assert queues == {"WorkQueueeuwest", "WorkQueueuseast"}


# ---------------------------------------------------------------- functions


def test_every_function_is_arm64_python312_plus_and_traced(template: dict[str, Any]) -> None:
    functions = _of_type(template, "AWS::Serverless::Function")
    assert functions, "no functions found"
    defaults = template.get("Globals", {}).get("Function", {})
    for name, resource in functions.items():
        props = {**defaults, **resource["Properties"]}
        assert props.get("Architectures") == ["arm64"], f"{name}: {props.get('Architectures')}"
        runtime = re.fullmatch(r"python3\.(\d+)", str(props.get("Runtime")))
        assert runtime and int(runtime.group(1)) >= 12, f"{name}: runtime {props.get('Runtime')}"
        assert props.get("Tracing") == "Active", f"{name}: tracing {props.get('Tracing')}"


def test_every_function_has_a_log_group_with_retention(template: dict[str, Any]) -> None:
    names = {
        lg["Properties"].get("LogGroupName", {}).get("Fn::Sub"): lg["Properties"].get("RetentionInDays")
        for lg in _of_type(template, "AWS::Logs::LogGroup").values()
        if isinstance(lg["Properties"].get("LogGroupName"), dict)
    }
    for name in _of_type(template, "AWS::Serverless::Function"):
        assert names.get(f"/aws/lambda/${{{name}}}"), f"{name} has no /aws/lambda/ log group with retention"


def _statements(owner: str, policies: Any) -> Iterator[dict[str, Any]]:
    for policy in _as_list(policies):
        if isinstance(policy, dict) and "Statement" in policy:
            yield from _as_list(policy["Statement"])
        elif isinstance(policy, dict) and len(policy) == 1:
            continue  # a SAM policy template: scoped by its parameters
        else:
            pytest.fail(f"{owner}: policy {policy!r} cannot be checked here (managed policy?)")


def _policy_owners(template: dict[str, Any]) -> dict[str, Any]:
    owners = {
        name: resource["Properties"].get("Policies", [])
        for kind in ("AWS::Serverless::Function", "AWS::Serverless::StateMachine")
        for name, resource in _of_type(template, kind).items()
    }
    assert {"WebhookFunction", "ProjectsFunction", "JobsFunction", "JobStateMachine"} <= set(owners)
    return owners


def _wildcard_problems(template: dict[str, Any]) -> list[str]:
    problems = []
    for owner, policies in _policy_owners(template).items():
        for statement in _statements(owner, policies):
            sid = statement.get("Sid", "<no Sid>")
            actions = [str(a) for a in _as_list(statement.get("Action", []))]
            if statement.get("Effect") == "Allow":
                for action in actions:
                    if action == "*" or action.endswith(":*"):
                        problems.append(f"{owner}/{sid}: Action {action}")
            if "*" in _as_list(statement.get("Resource", [])):
                prefix = WILDCARD_RESOURCE_SIDS.get((owner, sid)) or WILDCARD_RESOURCE_SIDS_ANY_OWNER.get(sid)
                if prefix is None or not all(a.startswith(prefix) for a in actions):
                    problems.append(f"{owner}/{sid}: Resource * ({', '.join(actions)})")
    return problems


def test_policies_are_least_privilege(template: dict[str, Any]) -> None:
    """No wildcard action anywhere; Resource "*" only in the statements whose Sid says why (log
    delivery, X-Ray, callback answers), and only for those actions."""
    assert _wildcard_problems(template) == []


@pytest.mark.parametrize(
    ("owner", "statement"),
    [
        (
            "JobsFunction",
            {"Sid": "Tracing", "Effect": "Allow", "Action": "xray:PutTraceSegments", "Resource": "*"},
        ),
        (
            "JobStateMachine",
            {"Sid": "Tracing", "Effect": "Allow", "Action": "sqs:SendMessage", "Resource": "*"},
        ),
        (
            "JobStateMachine",
            {"Sid": "Anything", "Effect": "Allow", "Action": "logs:GetLogDelivery", "Resource": "*"},
        ),
        ("WebhookFunction", {"Sid": "All", "Effect": "Allow", "Action": "dynamodb:*", "Resource": "arn:x"}),
        ("ProjectsFunction", {"Effect": "Allow", "Action": ["*"], "Resource": "arn:x"}),
    ],
)
def test_least_privilege_check_catches_wildcards(
    template: dict[str, Any], owner: str, statement: dict
) -> None:
    """The check above is real: each of these added statements is reported."""
    broken = copy.deepcopy(template)
    broken["Resources"][owner]["Properties"]["Policies"].append({"Statement": [statement]})
    added = set(_wildcard_problems(broken)) - set(_wildcard_problems(template))
    assert len(added) == 1 and next(iter(added)).startswith(f"{owner}/"), added


# ---------------------------------------------------------------- local deployment: deferred resources


def test_split_refuses_an_unhandled_resource_type() -> None:
    cfn = {"Resources": {"Thing": {"Type": "AWS::Made::Up", "Properties": {}}}}
    with pytest.raises(deferred.UnhandledResourceType, match=r"Thing \(AWS::Made::Up\)"):
        deferred.split(cfn, emulated_types=set())


def test_split_defers_an_alarm_with_its_intrinsics_as_outputs() -> None:
    dimension = {"Fn::GetAtt": ["WorkQueueeuwest", "QueueName"]}
    action = {"Ref": "NotificationTopic"}
    cfn = {
        "Resources": {
            "WorkQueueeuwest": {"Type": "AWS::SQS::Queue", "Properties": {"QueueName": "q"}},
            "NotificationTopic": {"Type": "AWS::SNS::Topic", "Properties": {}},
            "Alarm": {
                "Type": "AWS::CloudWatch::Alarm",
                "Properties": {
                    "Namespace": "AWS/SQS",
                    "MetricName": "ApproximateAgeOfOldestMessage",
                    "Dimensions": [{"Name": "QueueName", "Value": dimension}],
                    "Statistic": "Maximum",
                    "Period": 60,
                    "EvaluationPeriods": 3,
                    "Threshold": 900,
                    "ComparisonOperator": "GreaterThanThreshold",
                    "AlarmActions": [action],
                },
            },
            "Dependent": {
                "Type": "AWS::SNS::Topic",
                "DependsOn": ["Alarm", "WorkQueueeuwest"],
                "Properties": {},
            },
        }
    }
    remaining, later, not_emulated = deferred.split(cfn, {"AWS::SQS::Queue", "AWS::SNS::Topic"})

    assert set(remaining["Resources"]) == {"WorkQueueeuwest", "NotificationTopic", "Dependent"}
    assert remaining["Resources"]["Dependent"]["DependsOn"] == ["WorkQueueeuwest"]
    assert not_emulated == {}
    assert [(d.logical_id, d.type) for d in later] == [("Alarm", "AWS::CloudWatch::Alarm")]
    props = later[0].properties
    dimension_marker = props["Dimensions"][0]["Value"]
    (action_marker,) = props["AlarmActions"]
    outputs = remaining["Outputs"]
    assert outputs[dimension_marker["__relevo_output__"]] == {"Value": dimension}
    assert outputs[action_marker["__relevo_output__"]] == {"Value": action}
    assert props["Threshold"] == 900 and props["Dimensions"][0]["Name"] == "QueueName"

    # Once CloudFormation has resolved the Outputs, the alarm is created from the resolved values.
    calls: list[dict[str, Any]] = []

    class CloudWatch:
        def put_metric_alarm(self, **params: Any) -> None:
            calls.append(params)

        def describe_alarms(self, AlarmNames: list[str]) -> dict[str, Any]:  # noqa: N803
            return {"MetricAlarms": [{"AlarmArn": f"arn:aws:cloudwatch:::alarm:{AlarmNames[0]}"}]}

    class Session:
        def client(self, service: str) -> CloudWatch:
            assert service == "cloudwatch"
            return CloudWatch()

    resolved = {
        dimension_marker["__relevo_output__"]: "relevo-work-eu-west",
        action_marker["__relevo_output__"]: "arn:aws:sns:us-east-1:123456789012:relevo-notifications",
    }
    created = deferred.create(Session(), "relevo", later, resolved)
    assert created == {"Alarm": "arn:aws:cloudwatch:::alarm:relevo-Alarm"}
    (params,) = calls
    assert params["Dimensions"] == [{"Name": "QueueName", "Value": "relevo-work-eu-west"}]
    assert params["AlarmActions"] == ["arn:aws:sns:us-east-1:123456789012:relevo-notifications"]
    assert params["Threshold"] == 900.0 and params["EvaluationPeriods"] == 3


TRANSACTION_ITEM_ACTIONS = {
    "Update": "UpdateItem",
    "Put": "PutItem",
    "Delete": "DeleteItem",
    "ConditionCheck": "ConditionCheckItem",
}


def _asl_service_actions(node, found=None):
    """IAM actions the definition's Task states need (optimized and aws-sdk integrations)."""
    found = set() if found is None else found
    if isinstance(node, dict):
        resource = node.get("Resource")
        if (
            node.get("Type") == "Task"
            and isinstance(resource, str)
            and resource.startswith("arn:aws:states:::")
        ):
            service_action = resource.removeprefix("arn:aws:states:::").removeprefix("aws-sdk:").split(".")[0]
            service, action = service_action.split(":")
            action = action[0].upper() + action[1:]
            if service == "dynamodb" and action == "TransactWriteItems":
                # Transactions are authorised per item action (DynamoDB Developer Guide, "Using IAM
                # with DynamoDB transactions"): a ConditionCheck needs dynamodb:ConditionCheckItem.
                for item in node["Parameters"]["TransactItems"]:
                    (operation,) = item
                    found.add(f"dynamodb:{TRANSACTION_ITEM_ACTIONS[operation]}")
            else:
                # The AWS SDK integration names Step Functions `sfn`; its IAM prefix is `states`.
                found.add(f"{'states' if service == 'sfn' else service}:{action}")
        for value in node.values():
            _asl_service_actions(value, found)
    elif isinstance(node, list):
        for value in node:
            _asl_service_actions(value, found)
    return found


def test_the_state_machine_role_allows_every_action_its_definition_uses():
    """moto does not enforce IAM, so a missing permission would only show up in AWS."""
    template = load_sam_template(ROOT / "template.yaml")
    machine = template["Resources"]["JobStateMachine"]["Properties"]
    allowed = set()
    for policy in machine["Policies"]:
        for statement in policy["Statement"]:
            actions = statement["Action"]
            allowed.update([actions] if isinstance(actions, str) else actions)
    needed = set()
    for definition in JOB_MACHINES.values():
        needed |= _asl_service_actions(json.loads((ROOT / definition).read_text()))
    assert needed, "no service integrations found"
    assert needed <= allowed, f"missing from the state machine role: {sorted(needed - allowed)}"
