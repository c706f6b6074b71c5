"""The emulator's patches over moto, grouped by the service whose behaviour they change, and the
one entry point that applies them: `install`.

moto is the embedded AWS. Where it reads a template, a state machine or a request differently from
AWS, a patch here changes it; where it is too slow for the demo and the suite on a 2-core laptop,
a speed patch does, only with a gain measured (tests/helpers/emulator_patches.py) and named in its
docstring. Each names in its docstring the behaviour it fixes, and docs/emulator.md lists them all
with the AWS documentation and the test that pins each. The patches reach into moto's internals,
so they hold for the release they were verified against only: `install` refuses any other before
it changes anything.

- server: how moto's server serializes a DynamoDB answer (speed, its gain measured);
- stepfunctions: the ASL interpreter (parsing, callback tokens, stops, error names, its credentials);
- dynamodb: transactions' backups, streams and one action at a time;
- dynamodb_faults: conflicts a test arms, which AWS produces and the emulator never would;
- cloudformation: template reading and the resources moto creates from it;
- iam, dynamodb_authorization, sts: IAM enforcement as AWS does it;
- s3: what S3 answers a caller by its permissions (a missing key without s3:ListBucket).
"""

from __future__ import annotations

from importlib import metadata
from typing import TYPE_CHECKING

from relevo_local.moto import (
    cloudformation,
    dynamodb,
    dynamodb_authorization,
    dynamodb_faults,
    iam,
    s3,
    server,
    stepfunctions,
    sts,
)

if TYPE_CHECKING:
    from relevo_local.identity import RoleSessions

# The moto release every patch here was checked against (re-verify them all before adding another).
VERIFIED_MOTO = "5.2.5"


class UnverifiedMoto(RuntimeError):
    """moto is missing or not the release the patches were verified against."""


def check_moto_version() -> None:
    """Refuse, in one line, a moto the patches were not verified against."""
    try:
        installed = metadata.version("moto")
    except metadata.PackageNotFoundError:
        installed = None
    if installed != VERIFIED_MOTO:
        found = f"moto {installed} is installed" if installed else "moto is not installed"
        raise UnverifiedMoto(
            f"relevo local: {found}; the emulator's patches were verified against moto {VERIFIED_MOTO} "
            f"(pip install 'moto[server]=={VERIFIED_MOTO}')"
        )


def install(sessions: RoleSessions) -> None:
    """Every patch, before the emulator starts (each installs once per process; the order keeps the
    transaction faults inside the transaction backups, as they were first stacked).

    `sessions` are the role sessions the Step Functions interpreter calls services with."""
    check_moto_version()
    server.serialize_attribute_values_directly()
    stepfunctions.parse_each_state_machine_definition_once()
    stepfunctions.parse_each_json_path_once()
    stepfunctions.name_heartbeat_timeouts()
    stepfunctions.map_aws_sdk_parameters_to_member_names()
    stepfunctions.end_a_stopped_execution_aborted()
    stepfunctions.take_the_token_before_the_wait()
    stepfunctions.close_a_callback_when_its_wait_ends()
    stepfunctions.pass_on_the_cause_of_a_task_failure()
    stepfunctions.run_interpreter_as_execution_role(sessions)
    dynamodb.query_a_tables_partition_only()
    dynamodb.apply_dynamodb_actions_one_at_a_time()
    dynamodb_faults.raise_armed_conflicts()  # inert until a test arms a fault
    dynamodb.back_up_only_touched_items_in_transactions()
    cloudformation.store_key_policies_as_json()
    cloudformation.answer_managed_policy_attributes()
    cloudformation.drop_no_value_from_lists()
    cloudformation.attach_managed_policies_of_stack_roles()
    cloudformation.read_inline_policies_created_by_cloudformation()
    iam.name_the_resources_policies_scope()
    iam.sign_bodyless_requests_over_their_empty_body()
    iam.authorize_presigned_s3_urls()
    iam.trust_account_principals_as_iam_does()
    iam.refuse_json_requests_as_json()
    s3.refuse_missing_keys_without_list_bucket()
    dynamodb_authorization.authorize_dynamodb_as_aws_does()
    sts.record_session_tags()
    sts.resolve_policy_variables()
    sts.refuse_expired_sessions()
