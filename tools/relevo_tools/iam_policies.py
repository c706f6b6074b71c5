"""The IAM policies of template.yaml as AWS would see them, for `make lint`'s IAM lint
(relevo_tools.iam_lint): the template translated the way the local stack does it (Fn::ForEach,
the SAM transform), every intrinsic rendered to a realistic value for a sample account, region and
stack, and every policy document found by the type of the resource that holds it."""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from relevo_local.template import packaged_with, translate

ACCOUNT = "123456789012"
REGION = "us-east-1"
PARTITION = "aws"
STACK = "relevo"


class RenderError(ValueError):
    """The template uses something the renderer cannot turn into a value."""


# ---------------------------------------------------------------- rendering


# (name property, Ref value, {attribute: value}); values are formats over name, arn, partition,
# region, account. A type that is missing here makes rendering fail, never guess.
_PHYSICAL: dict[str, tuple[str | None, str, dict[str, str]]] = {
    "AWS::DynamoDB::Table": (
        "TableName",
        "{name}",
        {
            "Arn": "arn:{partition}:dynamodb:{region}:{account}:table/{name}",
            "StreamArn": (
                "arn:{partition}:dynamodb:{region}:{account}:table/{name}/stream/2026-01-01T00:00:00.000"
            ),
        },
    ),
    "AWS::SQS::Queue": (
        "QueueName",
        "https://sqs.{region}.amazonaws.com/{account}/{name}",
        {
            "Arn": "arn:{partition}:sqs:{region}:{account}:{name}",
            "QueueName": "{name}",
            "QueueUrl": "https://sqs.{region}.amazonaws.com/{account}/{name}",
        },
    ),
    "AWS::SNS::Topic": (
        "TopicName",
        "arn:{partition}:sns:{region}:{account}:{name}",
        {
            "TopicArn": "arn:{partition}:sns:{region}:{account}:{name}",
            "TopicName": "{name}",
        },
    ),
    "AWS::StepFunctions::StateMachine": (
        "StateMachineName",
        "arn:{partition}:states:{region}:{account}:stateMachine:{name}",
        {
            "Arn": "arn:{partition}:states:{region}:{account}:stateMachine:{name}",
            "Name": "{name}",
        },
    ),
    "AWS::Lambda::Function": (
        "FunctionName",
        "{name}",
        {
            "Arn": "arn:{partition}:lambda:{region}:{account}:function:{name}",
        },
    ),
    "AWS::Lambda::LayerVersion": (
        "LayerName",
        "arn:{partition}:lambda:{region}:{account}:layer:{name}:1",
        {},
    ),
    "AWS::IAM::Role": (
        "RoleName",
        "{name}",
        {
            "Arn": "arn:{partition}:iam::{account}:role/{name}",
            "RoleId": "AROASAMPLE{name}",
        },
    ),
    "AWS::IAM::ManagedPolicy": (
        "ManagedPolicyName",
        "arn:{partition}:iam::{account}:policy/{name}",
        {
            "PolicyArn": "arn:{partition}:iam::{account}:policy/{name}",
        },
    ),
    "AWS::S3::Bucket": (
        "BucketName",
        "{lower_name}",
        {
            "Arn": "arn:{partition}:s3:::{lower_name}",
        },
    ),
    "AWS::Logs::LogGroup": (
        "LogGroupName",
        "{name}",
        {
            "Arn": "arn:{partition}:logs:{region}:{account}:log-group:{name}:*",
        },
    ),
    "AWS::KMS::Key": (
        None,
        "0a1b2c3d-4e5f-6071-8293-{key_suffix}",
        {
            "Arn": "arn:{partition}:kms:{region}:{account}:key/0a1b2c3d-4e5f-6071-8293-{key_suffix}",
            "KeyId": "0a1b2c3d-4e5f-6071-8293-{key_suffix}",
        },
    ),
    "AWS::KMS::Alias": ("AliasName", "{name}", {}),
    "AWS::Scheduler::ScheduleGroup": (
        "Name",
        "{name}",
        {
            "Arn": "arn:{partition}:scheduler:{region}:{account}:schedule-group/{name}",
        },
    ),
    "AWS::CloudWatch::Alarm": (
        "AlarmName",
        "{name}",
        {
            "Arn": "arn:{partition}:cloudwatch:{region}:{account}:alarm:{name}",
        },
    ),
    "AWS::Events::Rule": (
        "Name",
        "{name}",
        {
            "Arn": "arn:{partition}:events:{region}:{account}:rule/{name}",
        },
    ),
    "AWS::SecretsManager::Secret": (
        "Name",
        "arn:{partition}:secretsmanager:{region}:{account}:secret:{name}-AbCdEf",
        {},
    ),
    "AWS::ApiGateway::RestApi": (None, "a1b2c3d4e5", {"RootResourceId": "r00t1d"}),
    "AWS::ApiGateway::Deployment": (None, "d3pl0y", {}),
}


class Renderer:
    """Resolves CloudFormation intrinsics of a translated template to the values AWS would give
    them in the sample account, region and stack (generated names look like CloudFormation's)."""

    def __init__(self, cfn: dict[str, Any], parameters: dict[str, str]) -> None:
        self.cfn = cfn
        self.resources: dict[str, Any] = cfn.get("Resources", {})
        self.pseudo = {
            "AWS::AccountId": ACCOUNT,
            "AWS::Region": REGION,
            "AWS::Partition": PARTITION,
            "AWS::StackName": STACK,
            "AWS::URLSuffix": "amazonaws.com",
            "AWS::StackId": (
                f"arn:{PARTITION}:cloudformation:{REGION}:{ACCOUNT}:stack/{STACK}/"
                "00000000-0000-0000-0000-000000000000"
            ),
        }
        self.parameters: dict[str, Any] = {}
        for name, slot in cfn.get("Parameters", {}).items():
            value = parameters.get(name, slot.get("Default"))
            if value is None:
                raise RenderError(f"parameter {name} has no value and no Default")
            value = str(value)
            self.parameters[name] = value.split(",") if "List" in str(slot.get("Type")) else value
        self.conditions: dict[str, bool] = {}

    def condition(self, name: str) -> bool:
        if name not in self.conditions:
            definitions = self.cfn.get("Conditions", {})
            if name not in definitions:
                raise RenderError(f"unknown condition {name}")
            self.conditions[name] = bool(self.value(definitions[name]))
        return self.conditions[name]

    def exists(self, logical_id: str) -> bool:
        resource = self.resources.get(logical_id)
        return resource is not None and ("Condition" not in resource or self.condition(resource["Condition"]))

    def value(self, node: Any) -> Any:
        if isinstance(node, list):
            return [v for v in (self.value(item) for item in node) if v is not _NO_VALUE]
        if not isinstance(node, dict):
            return node
        if len(node) == 1:
            ((key, argument),) = node.items()
            if key == "Ref":
                return self.ref(argument)
            if key == "Fn::GetAtt":
                logical_id, attribute = argument.split(".", 1) if isinstance(argument, str) else argument
                return self.get_att(logical_id, self.value(attribute))
            if key == "Fn::Sub":
                return self.sub(argument)
            if key == "Fn::Join":
                separator, items = argument
                return self.value(separator).join(str(v) for v in self.value(items))
            if key == "Fn::Select":
                index, items = argument
                return self.value(items)[int(self.value(index))]
            if key == "Fn::Split":
                separator, text = argument
                return str(self.value(text)).split(self.value(separator))
            if key == "Fn::If":
                name, when_true, when_false = argument
                return self.value(when_true if self.condition(name) else when_false)
            if key == "Fn::Equals":
                left, right = (self.value(v) for v in argument)
                return str(left) == str(right)
            if key == "Fn::Not":
                return not self.value(argument[0])
            if key == "Fn::And":
                return all(self.value(v) for v in argument)
            if key == "Fn::Or":
                return any(self.value(v) for v in argument)
            if key == "Condition":
                return self.condition(argument)
            if key.startswith("Fn::"):
                raise RenderError(f"the IAM lint cannot render {key}")
        rendered = {k: self.value(v) for k, v in node.items()}
        return {k: v for k, v in rendered.items() if v is not _NO_VALUE}

    def ref(self, name: str) -> Any:
        if name == "AWS::NoValue":
            return _NO_VALUE
        if name in self.pseudo:
            return self.pseudo[name]
        if name in self.parameters:
            return self.parameters[name]
        return self._physical(name)[0]

    def get_att(self, logical_id: str, attribute: str) -> str:
        attributes = self._physical(logical_id)[1]
        if attribute not in attributes:
            kind = self.resources[logical_id]["Type"]
            raise RenderError(
                f"the IAM lint does not know {kind} attribute {attribute} ({logical_id}.{attribute})"
            )
        return attributes[attribute]

    def sub(self, argument: Any) -> str:
        text, variables = (argument, {}) if isinstance(argument, str) else argument
        values = {k: self.value(v) for k, v in variables.items()}

        def replace(found: re.Match[str]) -> str:
            name = found.group(1)
            if name.startswith("!"):
                return "${" + name[1:] + "}"
            if name in values:
                return str(values[name])
            if "." in name and name.split(".", 1)[0] in self.resources:
                return str(self.get_att(*name.split(".", 1)))
            return str(self.ref(name))

        return re.sub(r"\$\{([^}]+)\}", replace, text)

    def _physical(self, logical_id: str) -> tuple[str, dict[str, str]]:
        resource = self.resources.get(logical_id)
        if resource is None:
            raise RenderError(f"Ref to {logical_id}, which is neither a parameter nor a resource")
        kind = resource["Type"]
        if kind not in _PHYSICAL:
            raise RenderError(
                f"the IAM lint does not know how AWS names a {kind} ({logical_id}); add it to _PHYSICAL"
            )
        name_property, ref_format, attribute_formats = _PHYSICAL[kind]
        explicit = resource.get("Properties", {}).get(name_property) if name_property else None
        # CloudFormation's generated names: stack-LogicalId-SUFFIX.
        name = str(self.value(explicit)) if explicit is not None else f"{STACK}-{logical_id}-1ABCDEFGHIJKL"
        fields = {
            "name": name,
            "lower_name": name.lower(),
            "partition": PARTITION,
            "region": REGION,
            "account": ACCOUNT,
            "key_suffix": f"{zlib.crc32(logical_id.encode()):012d}",
        }
        return ref_format.format(**fields), {k: v.format(**fields) for k, v in attribute_formats.items()}


class _NoValue:
    def __repr__(self) -> str:
        return "AWS::NoValue"


_NO_VALUE = _NoValue()


# ---------------------------------------------------------------- policies


@dataclass(frozen=True)
class PolicyDocument:
    owner: str  # the template resource that declares it (a SAM function for its generated role)
    holder: str  # the translated resource that carries it
    name: str  # inline policy name, or what kind of document it is
    kind: str  # identity | trust | resource
    document: dict[str, Any]


POLICY_HOLDERS = {
    "AWS::IAM::Role",
    "AWS::IAM::ManagedPolicy",
    "AWS::IAM::Policy",
    "AWS::KMS::Key",
    "AWS::SNS::TopicPolicy",
    "AWS::SQS::QueuePolicy",
    "AWS::S3::BucketPolicy",
}


def policy_documents(cfn: dict[str, Any], sam: dict[str, Any], renderer: Renderer) -> list[PolicyDocument]:
    """Every policy document of the translated template, rendered, whatever its resource is named."""
    sam_owned = {
        f"{logical_id}Role": logical_id
        for logical_id, resource in sam.get("Resources", {}).items()
        if resource.get("Type") in ("AWS::Serverless::Function", "AWS::Serverless::StateMachine")
    }
    found = []
    for logical_id, resource in cfn.get("Resources", {}).items():
        if not renderer.exists(logical_id):
            continue
        kind = resource.get("Type")
        if kind not in POLICY_HOLDERS:
            continue
        props = renderer.value(resource.get("Properties", {}))
        owner = sam_owned.get(logical_id, logical_id)

        def add(
            name: str, role: str, document: Any, owner: str = owner, logical_id: str = logical_id
        ) -> None:
            if not isinstance(document, dict):
                raise RenderError(f"{logical_id}: {name} is not a policy document")
            found.append(PolicyDocument(owner, logical_id, name, role, document))

        if kind == "AWS::IAM::Role":
            role_arn = renderer.get_att(logical_id, "Arn")
            # A trust policy's resource is the role itself.
            add(
                "AssumeRolePolicyDocument",
                "trust",
                _with_resource(props["AssumeRolePolicyDocument"], role_arn, only_missing=True),
            )
            for policy in props.get("Policies", []):
                add(policy["PolicyName"], "identity", policy["PolicyDocument"])
        elif kind in ("AWS::IAM::ManagedPolicy", "AWS::IAM::Policy"):
            add(
                props.get("ManagedPolicyName") or props.get("PolicyName") or logical_id,
                "identity",
                props["PolicyDocument"],
            )
        elif kind == "AWS::KMS::Key":
            # In a key policy, Resource "*" means this key (AWS KMS guide, "Key policies").
            add(
                "KeyPolicy",
                "resource",
                _with_resource(props["KeyPolicy"], renderer.get_att(logical_id, "Arn")),
            )
        elif kind in ("AWS::SNS::TopicPolicy", "AWS::SQS::QueuePolicy", "AWS::S3::BucketPolicy"):
            add("PolicyDocument", "resource", props["PolicyDocument"])
    return found


def _with_resource(document: dict[str, Any], arn: str, only_missing: bool = False) -> dict[str, Any]:
    statements = []
    for statement in as_list(document.get("Statement", [])):
        statement = dict(statement)
        if "Resource" not in statement and "NotResource" not in statement:
            statement["Resource"] = arn
        elif not only_missing:
            statement["Resource"] = [arn if r == "*" else r for r in as_list(statement["Resource"])]
        statements.append(statement)
    return {**document, "Statement": statements}


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def render(
    sam: dict[str, Any], root: Path, parameters: dict[str, str] | None = None
) -> tuple[dict[str, Any], Renderer]:
    """The translated template (SAM transform, offline) and its renderer for the sample stack."""
    pseudo = {
        "AWS::StackName": STACK,
        "AWS::Region": REGION,
        "AWS::AccountId": ACCOUNT,
        "AWS::Partition": PARTITION,
    }
    packaged = packaged_with(sam, root, lambda key, _body: f"s3://{STACK}-sample-deployment/{key}")
    cfn = translate(packaged, {**(parameters or {}), **pseudo}, None)
    return cfn, Renderer(cfn, parameters or {})
