"""Resources the emulator's CloudFormation cannot create, each handled explicitly.

A type here is either created through the emulator's service API from the template's own
(resolved) properties, or recorded in stack.json with the reason it is not emulated. A type that
is neither makes deployment fail, so nothing is ever dropped silently.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# Created from the template's properties through the service API: type -> creator.
Creator = Callable[[Any, str, str, dict[str, Any]], str]


def _create_alarm(session: Any, stack: str, logical_id: str, props: dict[str, Any]) -> str:
    cloudwatch = session.client("cloudwatch")
    name = props.get("AlarmName") or f"{stack}-{logical_id}"
    params: dict[str, Any] = {
        "AlarmName": name,
        "ComparisonOperator": props["ComparisonOperator"],
        "EvaluationPeriods": int(props["EvaluationPeriods"]),
        "Threshold": float(props["Threshold"]),
    }
    for field in ("AlarmDescription", "Namespace", "MetricName", "Statistic", "TreatMissingData", "Unit"):
        if field in props:
            params[field] = props[field]
    for field in ("Period", "DatapointsToAlarm"):
        if field in props:
            params[field] = int(props[field])
    for field in ("Dimensions", "AlarmActions", "OKActions", "InsufficientDataActions", "Metrics"):
        if field in props:
            params[field] = props[field]
    cloudwatch.put_metric_alarm(**params)
    return cloudwatch.describe_alarms(AlarmNames=[name])["MetricAlarms"][0]["AlarmArn"]


def _requires_tls(statement: dict[str, Any]) -> bool:
    return statement.get("Effect") == "Deny" and "aws:SecureTransport" in json.dumps(
        statement.get("Condition", {})
    )


def _create_bucket_policy(session: Any, stack: str, logical_id: str, props: dict[str, Any]) -> str:
    # The emulator serves plain HTTP only, so a deny-insecure-transport statement would refuse every
    # object request locally (and moto 5.2.5 turns any unmet Condition into a Deny as well): such
    # statements are left out of the local policy; the rest is applied as written.
    document = dict(props["PolicyDocument"])
    document["Statement"] = [s for s in document.get("Statement", []) if not _requires_tls(s)]
    if document["Statement"]:
        session.client("s3").put_bucket_policy(Bucket=props["Bucket"], Policy=json.dumps(document))
    return str(props["Bucket"])


def _create_schedule_group(session: Any, stack: str, logical_id: str, props: dict[str, Any]) -> str:
    name = props.get("Name") or f"{stack}-{logical_id}"
    tags = [{"Key": t["Key"], "Value": t["Value"]} for t in props.get("Tags", [])]
    session.client("scheduler").create_schedule_group(Name=name, Tags=tags)
    # Ref of a schedule group is its name.
    return str(name)


def _create_topic_policy(session: Any, stack: str, logical_id: str, props: dict[str, Any]) -> str:
    # moto 5.2.5's CloudFormation has no AWS::SNS::TopicPolicy; the policy is the topics' Policy
    # attribute, which SetTopicAttributes writes (and moto stores without enforcing on Publish).
    sns = session.client("sns")
    for topic_arn in props["Topics"]:
        sns.set_topic_attributes(
            TopicArn=topic_arn, AttributeName="Policy", AttributeValue=json.dumps(props["PolicyDocument"])
        )
    return f"{stack}-{logical_id}"


CREATED_THROUGH_API: dict[str, Creator] = {
    "AWS::CloudWatch::Alarm": _create_alarm,
    "AWS::S3::BucketPolicy": _create_bucket_policy,
    "AWS::SNS::TopicPolicy": _create_topic_policy,
    "AWS::Scheduler::ScheduleGroup": _create_schedule_group,
}

# Recorded in stack.json with the reason; nothing is created.
_SERVED_LOCALLY = (
    "the emulator's CloudFormation creates the RestApi but does not import its OpenAPI Body, so it "
    "has no methods to deploy; `relevo local up` serves every Api route of the template itself"
)
NOT_EMULATED: dict[str, str] = {
    "AWS::ApiGateway::Deployment": _SERVED_LOCALLY,
    "AWS::ApiGateway::Stage": _SERVED_LOCALLY,
    # Created only when AgentTrustAnchorArn is set; locally agents take their role as IAM
    # principals of the account, the template's other way in.
    "AWS::RolesAnywhere::Profile": "IAM Roles Anywhere is not emulated (moto 5.2.5 has no rolesanywhere)",
}


@dataclass
class Deferred:
    logical_id: str
    type: str
    properties: dict[str, Any]


def _is_intrinsic(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and len(value) == 1
        and next(iter(value))
        in {
            "Ref",
            "Fn::GetAtt",
            "Fn::Sub",
            "Fn::Join",
            "Fn::Select",
            "Fn::If",
            "Fn::ImportValue",
            "Fn::FindInMap",
        }
    )


def _extract(value: Any, outputs: dict[str, Any], prefix: str) -> Any:
    """Replace each intrinsic by a marker and an Output that CloudFormation will resolve."""
    if _is_intrinsic(value):
        name = f"{prefix}{len(outputs)}"
        outputs[name] = {"Value": value}
        return {"__relevo_output__": name}
    if isinstance(value, dict):
        return {key: _extract(item, outputs, prefix) for key, item in value.items()}
    if isinstance(value, list):
        return [_extract(item, outputs, prefix) for item in value]
    return value


def _restore(value: Any, resolved: dict[str, str]) -> Any:
    if isinstance(value, dict):
        if set(value) == {"__relevo_output__"}:
            return resolved[value["__relevo_output__"]]
        return {key: _restore(item, resolved) for key, item in value.items()}
    if isinstance(value, list):
        return [_restore(item, resolved) for item in value]
    return value


class UnhandledResourceType(Exception):
    pass


def split(
    cfn: dict[str, Any], emulated_types: set[str]
) -> tuple[dict[str, Any], list[Deferred], dict[str, str]]:
    """Take out what the emulator's CloudFormation cannot create.

    Returns the template to create, the resources to create afterwards through the service API
    (their intrinsics turned into stack Outputs), and the not-emulated ones with their reasons.
    """
    resources = cfn["Resources"]
    deferred: list[Deferred] = []
    not_emulated: dict[str, str] = {}
    unhandled = []
    for logical_id, resource in list(resources.items()):
        kind = resource["Type"]
        # The explicit lists win: some types the emulator accepts but cannot create faithfully.
        if kind in CREATED_THROUGH_API:
            deferred.append(Deferred(logical_id, kind, resource.get("Properties", {})))
        elif kind in NOT_EMULATED:
            not_emulated[logical_id] = f"{kind}: {NOT_EMULATED[kind]}"
        elif kind in emulated_types:
            continue
        else:
            unhandled.append(f"{logical_id} ({kind})")
            continue
        del resources[logical_id]
    if unhandled:
        raise UnhandledResourceType(
            "the emulator cannot create these and relevo_local/deferred.py does not handle them: "
            + ", ".join(unhandled)
        )
    removed = {d.logical_id for d in deferred} | set(not_emulated)
    for resource in resources.values():
        depends = resource.get("DependsOn")
        if isinstance(depends, str) and depends in removed:
            del resource["DependsOn"]
        elif isinstance(depends, list):
            resource["DependsOn"] = [name for name in depends if name not in removed]
    outputs = cfn.setdefault("Outputs", {})
    for index, item in enumerate(deferred):
        item.properties = _extract(item.properties, outputs, f"RelevoDeferred{index}x")
    return cfn, deferred, not_emulated


def create(session: Any, stack: str, deferred: list[Deferred], outputs: dict[str, str]) -> dict[str, str]:
    """Create the deferred resources from their now-resolved properties; logical id -> physical id."""
    created = {}
    for item in deferred:
        props = _restore(item.properties, outputs)
        created[item.logical_id] = CREATED_THROUGH_API[item.type](session, stack, item.logical_id, props)
    return created
