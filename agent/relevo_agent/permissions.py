"""What `relevo-agent doctor` asks of the credentials it runs with: can they do what an agent does,
and nothing an agent must never do?

Each probe is a request that cannot change anything: a conditional write whose condition never
holds, a visibility change of a receipt handle that does not exist, a task token that is no token,
a state machine that does not exist, a claim with an empty body, an object nobody wrote. AWS authorizes a
request before it looks at its condition or
its parameters, so an answer other than AccessDenied means the credentials may do it. The lists
follow the agent role of template.yaml (AgentPolicy per region affinity): an agent's credentials
pass every "needed" probe and none of the "must not" ones. What an agent does for a job (its
stage, log and artifact records, objects, signing identities, task tokens) it does with the job's
own credentials from its claim (JobPolicy), so its own credentials must be refused all of it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from relevo_core.aws import client, error_code

# A condition DynamoDB evaluates to false for every item, existing or not.
NEVER = "attribute_exists(pk) AND attribute_not_exists(pk)"
PROBE_ID = "relevo-doctor"
_REFUSED = {"AccessDenied", "AccessDeniedException", "UnauthorizedOperation"}


@dataclass(frozen=True)
class Probe:
    what: str  # in words: "write project items"
    action: str
    needed: bool  # True: an agent needs it; False: an agent must not have it
    call: Callable[[], Any]


@dataclass(frozen=True)
class Finding:
    probe: Probe
    allowed: bool | None  # None: the probe could not tell (network, throttling)
    why: str = ""

    @property
    def ok(self) -> bool:
        return self.allowed is self.probe.needed


def _put(table: str, pk: str, sk: str) -> Callable[[], Any]:
    return lambda: client("dynamodb").put_item(
        TableName=table, Item={"pk": {"S": pk}, "sk": {"S": sk}}, ConditionExpression=NEVER
    )


def _update(table: str, pk: str, sk: str, attribute: str) -> Callable[[], Any]:
    return lambda: client("dynamodb").update_item(
        TableName=table,
        Key={"pk": {"S": pk}, "sk": {"S": sk}},
        UpdateExpression="SET #a = :v",
        ConditionExpression=NEVER,
        ExpressionAttributeNames={"#a": attribute},
        ExpressionAttributeValues={":v": {"S": PROBE_ID}},
    )


def _secret(name: str) -> Callable[[], Any]:
    # A secret that does not exist: AWS authorizes GetSecretValue on the name's ARN first, so
    # ResourceNotFoundException means allowed and AccessDeniedException refused.
    return lambda: client("secretsmanager").get_secret_value(SecretId=name)


def _visibility(url: str) -> Callable[[], Any]:
    """A change of nothing's visibility on another region's queue."""
    return lambda: client("sqs").change_message_visibility(
        QueueUrl=url, ReceiptHandle=PROBE_ID, VisibilityTimeout=0
    )


def _route(api_url: str, region: str, aws_region: str) -> Callable[[], Any]:
    """A claim of nothing on `region`'s claim route: API Gateway authorizes execute-api:Invoke
    before the function reads the body, so a refusal of the body means the route is allowed."""
    from relevo_agent.claim_routes import ClaimRoutes, RouteError

    def call() -> Any:
        try:
            return ClaimRoutes(api_url, region, aws_region)._post("claims", {})
        except RouteError as refused:
            # API Gateway's own refusal (template GatewayResponses ACCESS_DENIED, UNAUTHENTICATED).
            code = "AccessDenied" if refused.status == 403 else str(refused.code)
            raise ClientError({"Error": {"Code": code, "Message": refused.message}}, "Invoke") from refused

    return call


def probes(
    table: str,
    region: str,
    queue_url: str,
    other_queues: dict[str, str],
    bucket: str | None,
    state_machine_arn: str | None,
    stack_name: str | None = None,
    api_url: str | None = None,
    aws_region: str | None = None,
) -> list[Probe]:
    job, stages = f"JOB#{PROBE_ID}", f"STAGES#{PROBE_ID}"
    found = [
        Probe(
            f"write presence in {region}",
            "dynamodb:PutItem",
            True,
            _put(table, f"AGENTS#{region}", f"AGENT#{PROBE_ID}"),
        ),
        Probe(
            f"read pauses in {region}",
            "dynamodb:BatchGetItem",
            True,
            lambda: client("dynamodb").batch_get_item(
                RequestItems={
                    table: {"Keys": [{"pk": {"S": f"PAUSES#{region}"}, "sk": {"S": f"PAUSE#{PROBE_ID}"}}]}
                }
            ),
        ),
        Probe(
            "hand stage messages back",
            "sqs:ChangeMessageVisibility",
            True,
            lambda: client("sqs").change_message_visibility(
                QueueUrl=queue_url, ReceiptHandle=PROBE_ID, VisibilityTimeout=0
            ),
        ),
        # What an agent must not do on its own credentials: they are what a compromised build
        # could borrow. What it does for a job it does with that job's credentials, from its claim.
        Probe(
            "read jobs and stages",
            "dynamodb:GetItem",
            False,
            lambda: client("dynamodb").get_item(
                TableName=table, Key={"pk": {"S": stages}, "sk": {"S": "STAGE#00"}}
            ),
        ),
        Probe(
            "write stage attempts", "dynamodb:UpdateItem", False, _update(table, stages, "STAGE#00", "status")
        ),
        Probe(
            "write log chunks", "dynamodb:PutItem", False, _put(table, f"LOGS#{PROBE_ID}", "SEQ#000000000000")
        ),
        Probe(
            "write artifact records", "dynamodb:PutItem", False, _put(table, f"ARTIFACTS#{PROBE_ID}", "probe")
        ),
        Probe(
            "answer stage tasks",
            "states:SendTaskHeartbeat",
            False,
            lambda: client("stepfunctions").send_task_heartbeat(taskToken=PROBE_ID),
        ),
        Probe(
            "write project items", "dynamodb:PutItem", False, _put(table, f"PROJECT#{PROBE_ID}", "PROJECT")
        ),
        Probe(
            "write grants", "dynamodb:PutItem", False, _put(table, f"PROJECT#{PROBE_ID}", f"GRANT#{PROBE_ID}")
        ),
        Probe("write project locks", "dynamodb:PutItem", False, _put(table, f"LOCK#{PROBE_ID}", "LOCK")),
        Probe("write dedup records", "dynamodb:PutItem", False, _put(table, f"DEDUP#{PROBE_ID}", "DEDUP")),
        Probe(
            "set or lift pauses",
            "dynamodb:PutItem",
            False,
            _put(table, f"PAUSES#{region}", f"PAUSE#{PROBE_ID}"),
        ),
        Probe(
            "rewrite a job's envelope (its stage commands)",
            "dynamodb:UpdateItem",
            False,
            _update(table, job, "JOB", "packed_envelope"),
        ),
        Probe("rewrite a job's outcome", "dynamodb:UpdateItem", False, _update(table, job, "JOB", "status")),
        Probe(
            "delete items",
            "dynamodb:DeleteItem",
            False,
            lambda: client("dynamodb").delete_item(
                TableName=table, Key={"pk": {"S": job}, "sk": {"S": "JOB"}}, ConditionExpression=NEVER
            ),
        ),
    ]
    if bucket:
        found.append(
            Probe(
                "read objects of the artifact bucket",
                "s3:GetObject",
                False,
                lambda: client("s3").get_object(Bucket=bucket, Key=f"{PROBE_ID}/{PROBE_ID}/none"),
            )
        )
    if api_url:
        found.insert(
            3,
            Probe(
                f"claim {region}'s stages",
                "execute-api:Invoke",
                True,
                _route(api_url, region, aws_region or "us-east-1"),
            ),
        )
        for other in sorted(other_queues):
            found.append(
                Probe(
                    f"claim {other}'s stages",
                    "execute-api:Invoke",
                    False,
                    _route(api_url, other, aws_region or "us-east-1"),
                )
            )
    for other, url in sorted(other_queues.items()):
        found.append(
            Probe(
                f"take {other}'s stages",
                "sqs:ChangeMessageVisibility",
                False,
                _visibility(url),
            )
        )
    if stack_name:
        found.append(
            Probe(
                "read signing identities",
                "secretsmanager:GetSecretValue",
                False,
                _secret(f"relevo/{stack_name}/_signing/{region}/{PROBE_ID}/none"),
            )
        )
        found.append(
            Probe(
                "read checkout credentials",
                "secretsmanager:GetSecretValue",
                False,
                _secret(f"relevo/{stack_name}/_git/{PROBE_ID}/none"),
            )
        )
        found.append(
            Probe(
                "read webhook secrets",
                "secretsmanager:GetSecretValue",
                False,
                _secret(f"relevo/{stack_name}/{PROBE_ID}/github"),
            )
        )
    if state_machine_arn:
        missing = state_machine_arn.rsplit(":", 1)[0] + f":{PROBE_ID}-none"
        found.append(
            Probe(
                "start executions",
                "states:StartExecution",
                False,
                lambda: client("stepfunctions").start_execution(stateMachineArn=missing, input="{}"),
            )
        )
    return found


def run(probe: Probe) -> Finding:
    try:
        probe.call()
    except ClientError as exc:
        code = error_code(exc)
        if code in _REFUSED:
            return Finding(probe, False, code)
        return Finding(probe, True, code)  # authorized, then refused for what it asked
    except BotoCoreError as exc:
        return Finding(probe, None, str(exc))
    return Finding(probe, True)


def summary(findings: list[Finding]) -> tuple[bool, str]:
    """One line for doctor: what is missing, what is too much, or that the credentials fit."""
    missing = [f for f in findings if f.probe.needed and f.allowed is False]
    excess = [f for f in findings if not f.probe.needed and f.allowed]
    unknown = [f for f in findings if f.allowed is None]
    parts = []
    if missing:
        parts.append("missing: " + "; ".join(f"cannot {f.probe.what} ({f.probe.action})" for f in missing))
    if excess:
        parts.append(
            "excess: "
            + "; ".join(
                f"these credentials can {f.probe.what} ({f.probe.action}); an agent's should not"
                for f in excess
            )
        )
    if unknown:
        parts.append("could not check: " + "; ".join(f"{f.probe.what} ({f.why})" for f in unknown))
    if parts:
        return False, " · ".join(parts)
    needed = sum(1 for f in findings if f.probe.needed)
    return (
        True,
        f"all {needed} an agent needs are allowed, and the {len(findings) - needed} it must not have are "
        "refused",
    )
