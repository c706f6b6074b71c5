"""The notification topic as deployed on the embedded stack: encrypted with the stack's own key,
and with the template's topic policy (moto 5.2.5's CloudFormation has no AWS::SNS::TopicPolicy;
the local stack writes it with SetTopicAttributes, local/relevo_local/deferred.py)."""

from __future__ import annotations

import json

from relevo_core.aws import client


def test_the_topic_carries_its_key_and_the_templates_topic_policy(local_stack):
    attributes = client("sns").get_topic_attributes(TopicArn=local_stack.resources["NotificationTopic"])[
        "Attributes"
    ]
    assert attributes["KmsMasterKeyId"] == local_stack.resources["NotificationKey"]
    policy = json.loads(attributes["Policy"])
    assert [s["Sid"] for s in policy["Statement"]] == ["StackAlarmsPublish", "StackRulesPublish"]
    alarms = policy["Statement"][0]
    assert alarms["Principal"] == {"Service": "cloudwatch.amazonaws.com"}
    assert alarms["Resource"] == local_stack.resources["NotificationTopic"]
    assert alarms["Condition"]["ArnLike"]["aws:SourceArn"].endswith(f":alarm:{local_stack.stack_name}-*")


def test_the_topics_key_is_readable_with_its_policy(local_stack):
    # moto 5.2.5 stored a CloudFormation key's policy as a document and failed (500) on reading it.
    kms = client("kms")
    key = local_stack.resources["NotificationKey"]
    assert kms.describe_key(KeyId=key)["KeyMetadata"]["KeyState"] == "Enabled"
    policy = json.loads(kms.get_key_policy(KeyId=key, PolicyName="default")["Policy"])
    assert any("cloudwatch.amazonaws.com" in json.dumps(s.get("Principal")) for s in policy["Statement"])
