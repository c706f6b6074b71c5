"""Patches over moto's CloudFormation: how it reads a template (AWS::NoValue in lists) and the
resources it creates from one (a KMS key's policy, a managed policy's attributes, a role's managed
and inline policies), and the stack output that names the local API. Each docstring names the
moto 5.2.5 behaviour it changes; docs/emulator.md lists them with the test that pins each."""

from __future__ import annotations

import json
from typing import Any


def drop_no_value_from_lists() -> None:
    """`AWS::NoValue` removes what it stands for, a list element included (CloudFormation,
    pseudo parameters: AWS::NoValue), e.g. a trust policy statement behind `Fn::If`. moto 5.2.5
    drops it from maps but leaves None in a list, and its IAM then fails (500) on the trust
    policy's None statement. Drop it from lists too. Installed once."""
    import moto.cloudformation.parsing as parsing

    if getattr(parsing, "_relevo_no_value_in_lists", False):
        return
    original = parsing.clean_json

    def clean_json(resource_json: Any, resources_map: Any) -> Any:
        if isinstance(resource_json, list):
            cleaned = (original(value, resources_map) for value in resource_json)
            return [value for value in cleaned if value is not None]
        return original(resource_json, resources_map)

    parsing.clean_json = clean_json
    parsing._relevo_no_value_in_lists = True


def store_key_policies_as_json() -> None:
    """moto 5.2.5's CloudFormation creates an AWS::KMS::Key with its KeyPolicy as a parsed
    document; its KMS API then fails (500) on every call that reads the policy (DescribeKey,
    GetKeyPolicy), which expect the JSON text KMS keeps. Give it the text. Installed once."""
    import moto.kms.models as kms_models

    if getattr(kms_models, "_relevo_key_policy_text", False):
        return
    original = kms_models.Key.create_from_cloudformation_json.__func__

    def create_from_cloudformation_json(
        cls: Any, resource_name: str, cloudformation_json: Any, *args: Any, **kwargs: Any
    ) -> Any:
        properties = cloudformation_json.get("Properties", {})
        if isinstance(properties.get("KeyPolicy"), dict):
            cloudformation_json = {
                **cloudformation_json,
                "Properties": {**properties, "KeyPolicy": json.dumps(properties["KeyPolicy"])},
            }
        return original(cls, resource_name, cloudformation_json, *args, **kwargs)

    kms_models.Key.create_from_cloudformation_json = classmethod(create_from_cloudformation_json)
    kms_models._relevo_key_policy_text = True


def answer_managed_policy_attributes() -> None:
    """`Fn::GetAtt [Policy, PolicyArn]` of an AWS::IAM::ManagedPolicy is its ARN (CloudFormation
    resource reference, return values); moto 5.2.5's ManagedPolicy has no attributes at all and
    fails the stack with an AttributeError. Installed once."""
    from moto.iam.models import ManagedPolicy

    if getattr(ManagedPolicy, "_relevo_cfn_attributes", False):
        return

    def get_cfn_attribute(self: Any, attribute_name: str) -> str:
        from moto.cloudformation.exceptions import UnformattedGetAttTemplateException

        if attribute_name == "PolicyArn":
            return str(self.arn)
        if attribute_name == "PolicyId":
            return str(self.id)
        raise UnformattedGetAttTemplateException()

    ManagedPolicy.has_cfn_attr = classmethod(lambda cls, attr: attr in ("PolicyArn", "PolicyId"))
    ManagedPolicy.get_cfn_attribute = get_cfn_attribute
    ManagedPolicy._relevo_cfn_attributes = True


def attach_managed_policies_of_stack_roles() -> None:
    """An AWS::IAM::Role's ManagedPolicyArns are attached to it (CloudFormation, AWS::IAM::Role);
    moto 5.2.5's CloudFormation ignores the property, so a role whose powers come from a managed
    policy (each region's agent role) could do nothing. Attach the ones the emulator has: the
    stack's own; AWS managed policies (SAM's AWSLambdaBasicExecutionRole, AWSXrayWriteOnlyAccess)
    are not loaded by moto and grant only CloudWatch Logs and X-Ray, which no function calls
    through the API locally. Installed once."""
    from moto.iam.models import Role, iam_backends

    if getattr(Role, "_relevo_managed_policy_arns", False):
        return
    original = Role.create_from_cloudformation_json.__func__

    def create_from_cloudformation_json(
        cls: Any,
        resource_name: str,
        cloudformation_json: Any,
        account_id: str,
        region_name: str,
        **kwargs: Any,
    ) -> Any:
        role = original(cls, resource_name, cloudformation_json, account_id, region_name, **kwargs)
        backend = iam_backends[account_id]["aws"]
        known = {policy.arn for policy in backend.managed_policies.values()}
        for arn in cloudformation_json.get("Properties", {}).get("ManagedPolicyArns", []):
            if arn in known:
                backend.attach_role_policy(arn, role.name)
        return role

    Role.create_from_cloudformation_json = classmethod(create_from_cloudformation_json)
    Role._relevo_managed_policy_arns = True


def read_inline_policies_created_by_cloudformation() -> None:
    """moto 5.2.5's CloudFormation stores a role's inline `Policies` as parsed documents, and its
    IAM authorization then fails (500, KeyError 'policy_document') on the first request a
    stack-created role makes, since it expects each document as JSON text. Read those documents
    as the JSON they are."""
    from moto.iam import access_control

    if getattr(access_control.IAMPolicy, "_relevo_inline_policies_as_json", False):
        return

    original = access_control.IAMPolicy.__init__

    def __init__(self: Any, policy: Any) -> None:
        if isinstance(policy, dict) and "policy_document" not in policy:
            policy = json.dumps(policy)
        original(self, policy)

    access_control.IAMPolicy.__init__ = __init__
    access_control.IAMPolicy._relevo_inline_policies_as_json = True


def point_api_url_output_at_the_adapter(stack_name: str, region: str, url: str) -> None:
    """On AWS the stack's ApiUrl output is the API's invoke URL. Locally the API is served by the
    adapter (moto 5.2.5 cannot create SAM's RestApi), so the output names the adapter's URL: a
    tool that finds the stack through CloudFormation (`relevo stack use`) reaches its API."""
    from moto.cloudformation.models import cloudformation_backends

    from relevo_local.identity import ACCOUNT_ID

    for stack in cloudformation_backends[ACCOUNT_ID][region].stacks.values():
        if stack.name == stack_name and "ApiUrl" in stack.output_map.outputs:
            stack.output_map["ApiUrl"].value = url  # type: ignore[union-attr]  # checked in the line above
