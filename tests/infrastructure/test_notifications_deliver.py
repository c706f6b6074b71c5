"""Every alarm action, OK action, EventBridge target and on-failure destination of template.yaml
names a topic its publisher can publish to, under the topic's policy and the topic's KMS key.

The emulator cannot show this: it stores alarms but never evaluates them, and publishes to an
encrypted topic without asking KMS. On AWS (Amazon SNS Developer Guide, "Key management",
compatibility between event sources from AWS services and encrypted topics; AWS re:Post
"configure a CloudWatch alarm with an encrypted SNS topic"), CloudWatch needs kms:Decrypt and
kms:GenerateDataKey* on the topic's key, which the AWS managed key alias/aws/sns cannot grant: the
alarm history then says "CloudWatch Alarms does not have authorization to access the SNS topic
encryption key". IAM principals publishing to an encrypted topic need the same two KMS actions.

The documents of the rendered template (relevo_tools.iam_policies.render) are evaluated with
relevo_local.iam_evaluation, a small evaluator written for this (see its docstring for what it
supports).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from relevo_local.iam_evaluation import PolicyDecision, Request, UnsupportedPolicy, evaluate
from relevo_local.template import load_sam_template
from relevo_tools import iam_policies

ROOT = Path(__file__).resolve().parents[2]
ACCOUNT, REGION = iam_policies.ACCOUNT, iam_policies.REGION
ROOT_PRINCIPAL = f"arn:aws:iam::{ACCOUNT}:root"
KMS_ACTIONS = ("kms:GenerateDataKey", "kms:Decrypt")


@dataclass(frozen=True)
class Publisher:
    who: str  # e.g. "OnlineAgentsAlarmeuwest OKActions"
    topic_arn: str
    principal: dict[str, str]
    context: dict[str, str]
    identity: tuple[dict[str, Any], ...] = ()  # the role's own policies, for an IAM principal


class Stack:
    """The rendered template, and who publishes where."""

    def __init__(self, sam: dict[str, Any]) -> None:
        self.cfn, self.renderer = iam_policies.render(sam, ROOT)
        self.resources = {k: v for k, v in self.cfn["Resources"].items() if self.renderer.exists(k)}

    def of_type(self, kind: str) -> dict[str, dict[str, Any]]:
        return {
            k: self.renderer.value(v.get("Properties", {}))
            for k, v in self.resources.items()
            if v["Type"] == kind
        }

    def role_policies(self, role: str) -> tuple[dict[str, Any], ...]:
        props = self.of_type("AWS::IAM::Role")[role]
        return tuple(p["PolicyDocument"] for p in props.get("Policies", []))

    def publishers(self) -> list[Publisher]:
        found = []
        for name, props in self.of_type("AWS::CloudWatch::Alarm").items():
            for field in ("AlarmActions", "OKActions", "InsufficientDataActions"):
                for arn in props.get(field, []):
                    if ":sns:" in arn:
                        source = self.renderer.get_att(name, "Arn")
                        found.append(
                            Publisher(
                                f"{name} {field}",
                                arn,
                                {"Service": "cloudwatch.amazonaws.com"},
                                {"aws:SourceArn": source, "aws:SourceAccount": ACCOUNT},
                            )
                        )
        for name, props in self.of_type("AWS::Events::Rule").items():
            for target in props.get("Targets", []):
                if ":sns:" in target["Arn"]:
                    source = self.renderer.get_att(name, "Arn")
                    found.append(
                        Publisher(
                            f"{name} target",
                            target["Arn"],
                            {"Service": "events.amazonaws.com"},
                            {"aws:SourceArn": source, "aws:SourceAccount": ACCOUNT},
                        )
                    )
        roles = {self.renderer.get_att(r, "Arn"): r for r in self.of_type("AWS::IAM::Role")}
        functions = self.of_type("AWS::Lambda::Function")
        for name, props in self.of_type("AWS::Lambda::EventSourceMapping").items():
            destination = props.get("DestinationConfig", {}).get("OnFailure", {}).get("Destination", "")
            if ":sns:" in destination:
                # Lambda sends to a destination with the function's execution role (AWS Lambda
                # Developer Guide, "Capturing discarded batches for an event source mapping").
                function = next(
                    f
                    for f in functions
                    if props["FunctionName"] in (self.renderer.ref(f), self.renderer.get_att(f, "Arn"))
                )
                role_arn = functions[function]["Role"]
                found.append(
                    self._role_publisher(f"{name} OnFailure", destination, role_arn, roles[role_arn])
                )
        # Every role that may publish to a topic of the template (the sweeper, the state machine).
        for topic_arn in (self.renderer.ref(t) for t in self.of_type("AWS::SNS::Topic")):
            for role_arn, role in roles.items():
                if (
                    evaluate(list(self.role_policies(role)), Request("sns:Publish", topic_arn))
                    is PolicyDecision.ALLOW
                ):
                    found.append(self._role_publisher(f"{role} sns:Publish", topic_arn, role_arn, role))
        return found

    def _role_publisher(self, who: str, topic_arn: str, role_arn: str, role: str) -> Publisher:
        # SNS uses the key on the publisher's behalf (kms:ViaService, kms:CallerAccount).
        context = {"kms:ViaService": f"sns.{REGION}.amazonaws.com", "kms:CallerAccount": ACCOUNT}
        return Publisher(who, topic_arn, {"AWS": role_arn}, context, self.role_policies(role))

    def topic(self, topic_arn: str) -> str:
        return next(t for t in self.of_type("AWS::SNS::Topic") if self.renderer.ref(t) == topic_arn)

    def topic_policies(self, topic_arn: str) -> list[dict[str, Any]]:
        return [
            p["PolicyDocument"]
            for p in self.of_type("AWS::SNS::TopicPolicy").values()
            if topic_arn in p["Topics"]
        ]

    def key_policy(self, key_reference: str) -> tuple[str, dict[str, Any]] | None:
        """The key a KmsMasterKeyId names (id, ARN or alias of a key of the template)."""
        aliases = {p["AliasName"]: p["TargetKeyId"] for p in self.of_type("AWS::KMS::Alias").values()}
        reference = aliases.get(key_reference, key_reference)
        for key, props in self.of_type("AWS::KMS::Key").items():
            if reference in (self.renderer.ref(key), self.renderer.get_att(key, "Arn")):
                return self.renderer.get_att(key, "Arn"), props["KeyPolicy"]
        return None


def refusals(stack: Stack, publisher: Publisher) -> list[str]:
    """Why `publisher` cannot publish to its topic; empty when it can."""
    problems = []
    topic_request = Request("sns:Publish", publisher.topic_arn, publisher.principal, publisher.context)
    topic_decisions = {evaluate(stack.topic_policies(publisher.topic_arn), topic_request)}
    if publisher.identity:
        # Same account: the role's own policy or the topic policy may allow, neither may deny.
        topic_decisions.add(evaluate(list(publisher.identity), Request("sns:Publish", publisher.topic_arn)))
    if PolicyDecision.DENY in topic_decisions or PolicyDecision.ALLOW not in topic_decisions:
        problems.append(f"the topic policy does not let {publisher.principal} publish ({publisher.context})")

    key_reference = stack.of_type("AWS::SNS::Topic")[stack.topic(publisher.topic_arn)].get("KmsMasterKeyId")
    if key_reference is None:
        return problems
    if str(key_reference).startswith("alias/aws/"):
        if "Service" in publisher.principal:
            problems.append(
                f"{key_reference} is an AWS managed key: its key policy cannot let "
                f"{publisher.principal['Service']} use it"
            )
        return problems
    key = stack.key_policy(str(key_reference))
    if key is None:
        return problems + [f"KmsMasterKeyId {key_reference} names no key of the template"]
    key_arn, key_policy = key
    for action in KMS_ACTIONS:
        direct = evaluate([key_policy], Request(action, key_arn, publisher.principal, publisher.context))
        # A key policy that allows the account root delegates to the principal's IAM policies.
        delegated = (
            publisher.identity
            and evaluate([key_policy], Request(action, key_arn, {"AWS": ROOT_PRINCIPAL}, publisher.context))
            is PolicyDecision.ALLOW
        )
        identity = (
            evaluate(list(publisher.identity), Request(action, key_arn, None, publisher.context))
            if publisher.identity
            else PolicyDecision.NO_MATCH
        )
        if PolicyDecision.DENY in (direct, identity) or not (
            direct is PolicyDecision.ALLOW or (delegated and identity is PolicyDecision.ALLOW)
        ):
            problems.append(f"{action} on {key_arn} is not allowed to {publisher.principal}")
    return problems


@pytest.fixture(scope="module")
def sam() -> dict[str, Any]:
    return load_sam_template(ROOT / "template.yaml")


@pytest.fixture(scope="module")
def stack(sam: dict[str, Any]) -> Stack:
    return Stack(sam)


def test_publishers_are_found(stack: Stack) -> None:
    who = {p.who for p in stack.publishers()}
    assert {
        "JobDeadLetterAlarm AlarmActions",
        "WorkQueueAgeAlarmeuwest AlarmActions",
        "OnlineAgentsAlarmuseast OKActions",
    } <= who
    # The table stream's failure destinations are SQS queues (StatusDeadLetterQueue,
    # ArtifactQuotaDeadLetterQueue): none publishes to a topic since the metrics reader merged
    # into the status reporter. A mapping that sends to SNS again is found and checked below.
    assert not any(w.endswith("OnFailure") for w in who), who
    assert {"SweeperFunctionRole sns:Publish", "JobStateMachineRole sns:Publish"} <= who


def test_every_alarm_action_and_failure_destination_can_publish(stack: Stack) -> None:
    problems = {p.who: refusals(stack, p) for p in stack.publishers()}
    assert {who: why for who, why in problems.items() if why} == {}


def test_the_notification_key_rotates_and_the_account_administers_it(stack: Stack) -> None:
    topic = stack.of_type("AWS::SNS::Topic")["NotificationTopic"]
    key_arn, policy = stack.key_policy(topic["KmsMasterKeyId"]) or pytest.fail(
        "the topic's key is not a key of the template"
    )
    [key] = [
        props
        for name, props in stack.of_type("AWS::KMS::Key").items()
        if stack.renderer.get_att(name, "Arn") == key_arn
    ]
    assert key["EnableKeyRotation"] is True
    for action in ("kms:PutKeyPolicy", "kms:ScheduleKeyDeletion", "kms:DescribeKey"):
        assert evaluate([policy], Request(action, key_arn, {"AWS": ROOT_PRINCIPAL})) is PolicyDecision.ALLOW


# ---------------------------------------------------------------- the check is real


def _alarm(stack: Stack) -> Publisher:
    return next(p for p in stack.publishers() if p.who == "JobDeadLetterAlarm AlarmActions")


def test_an_aws_managed_key_is_refused(sam: dict[str, Any]) -> None:
    """Finding 5 as the template had it before issue 13."""
    broken = copy.deepcopy(sam)
    broken["Resources"]["NotificationTopic"]["Properties"]["KmsMasterKeyId"] = "alias/aws/sns"
    changed = Stack(broken)
    assert any("AWS managed key" in why for why in refusals(changed, _alarm(changed)))


def test_a_key_policy_without_cloudwatch_is_refused(sam: dict[str, Any]) -> None:
    broken = copy.deepcopy(sam)
    key = "NotificationKey"
    statements = broken["Resources"][key]["Properties"]["KeyPolicy"]["Statement"]
    broken["Resources"][key]["Properties"]["KeyPolicy"]["Statement"] = [
        s for s in statements if "cloudwatch.amazonaws.com" not in str(s.get("Principal"))
    ]
    changed = Stack(broken)
    assert any("kms:GenerateDataKey" in why for why in refusals(changed, _alarm(changed)))


def test_a_topic_policy_for_another_accounts_alarms_is_refused(stack: Stack) -> None:
    alarm = _alarm(stack)
    foreign = Publisher(
        alarm.who,
        alarm.topic_arn,
        alarm.principal,
        {
            "aws:SourceArn": alarm.context["aws:SourceArn"].replace(ACCOUNT, "999999999999"),
            "aws:SourceAccount": "999999999999",
        },
    )
    assert any("topic policy" in why for why in refusals(stack, foreign))


def test_a_role_without_kms_on_the_key_is_refused(stack: Stack) -> None:
    sweeper = next(p for p in stack.publishers() if p.who == "SweeperFunctionRole sns:Publish")
    publish_only = (
        {
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": "sns:Publish", "Resource": sweeper.topic_arn}],
        },
    )
    stripped = Publisher(sweeper.who, sweeper.topic_arn, sweeper.principal, sweeper.context, publish_only)
    assert any("kms:Decrypt" in why for why in refusals(stack, stripped))


def test_the_evaluator_applies_denies_conditions_and_refuses_what_it_does_not_know() -> None:
    allow = {
        "Effect": "Allow",
        "Principal": {"Service": "cloudwatch.amazonaws.com"},
        "Action": "sns:Publish",
        "Resource": "*",
        "Condition": {"ArnLike": {"aws:SourceArn": "arn:aws:cloudwatch:*:1:alarm:relevo-*"}},
    }
    deny = {
        "Effect": "Deny",
        "Principal": "*",
        "Action": "sns:*",
        "Resource": "*",
        "Condition": {"Bool": {"aws:SecureTransport": "false"}},
    }
    request = Request(
        "SNS:Publish",
        "arn:aws:sns:us-east-1:1:t",
        {"Service": "cloudwatch.amazonaws.com"},
        {"aws:SourceArn": "arn:aws:cloudwatch:us-east-1:1:alarm:relevo-x", "aws:SecureTransport": "true"},
    )
    assert evaluate([{"Statement": [allow, deny]}], request) is PolicyDecision.ALLOW
    insecure = Request(
        request.action,
        request.resource,
        request.principal,
        {**request.context, "aws:SecureTransport": "false"},
    )
    assert evaluate([{"Statement": [allow, deny]}], insecure) is PolicyDecision.DENY
    other_alarm = Request(
        request.action,
        request.resource,
        request.principal,
        {"aws:SourceArn": "arn:aws:cloudwatch:us-east-1:1:alarm:other"},
    )
    assert evaluate([{"Statement": [allow]}], other_alarm) is PolicyDecision.NO_MATCH
    no_source = Request(request.action, request.resource, request.principal)
    assert evaluate([{"Statement": [allow]}], no_source) is PolicyDecision.NO_MATCH
    assert (
        evaluate([{"Statement": [{**allow, "Principal": {"AWS": "*"}}]}], request) is PolicyDecision.NO_MATCH
    )
    with pytest.raises(UnsupportedPolicy):
        evaluate(
            [
                {
                    "Statement": [
                        {**allow, "Condition": {"DateLessThan": {"aws:CurrentTime": "2030-01-01T00:00:00Z"}}}
                    ]
                }
            ],
            request,
        )
