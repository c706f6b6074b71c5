"""`relevo group apply` and `relevo group test`: a group's definition, its email subscriptions,
and one test message per channel.

Email addresses are subscriptions of the one group topic, each with a filter policy on the
`group` message attribute ("Amazon SNS message filtering"). SNS keeps one subscription per
endpoint and topic, and refuses a second Subscribe of it with other attributes ("Subscription
already exists with different attributes"), so an address in two groups is one subscription whose
policy lists both: applying a group rewrites the policy of each address it gains or loses.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from botocore.exceptions import ClientError
from pydantic import ValidationError

from relevo_core.aws import client, error_code
from relevo_core.config.notify import GroupApiSettings
from relevo_core.models.delivery import DeliveryRecord, Direction, Outcome
from relevo_core.models.envelope import validation_error
from relevo_core.models.errors import ErrorCode, RelevoError
from relevo_core.models.group import Group, GroupEvent
from relevo_core.notify.messages import Notice, email_message, slack_message
from relevo_core.notify.sending import Clock, OutgoingRequest, SendPolicy, Transport, send
from relevo_core.projects.permissions import is_admin
from relevo_core.store.deliveries import record_delivery
from relevo_core.store.groups import get_group, put_group

DAY = 86_400


def _require_admin(settings: GroupApiSettings, caller: str) -> None:
    # A group's channels hear every project in it: defining them is the stack admins' call.
    if not is_admin(settings, caller):
        raise RelevoError(
            ErrorCode.FORBIDDEN,
            f"{caller} is not an admin of this stack (AdminPrincipals); groups are theirs to define",
        )


def apply_group(settings: GroupApiSettings, name: str, body: Any, caller: str) -> dict[str, Any]:
    _require_admin(settings, caller)
    if not isinstance(body, dict):
        raise RelevoError(ErrorCode.VALIDATION_FAILED, "(root): a group is a JSON object")
    try:
        group = Group.model_validate({**body, "name": body.get("name", name)})
    except ValidationError as exc:
        raise validation_error(exc) from exc
    if group.name != name:
        raise RelevoError(
            ErrorCode.VALIDATION_FAILED, f"name: the body names {group.name!r}, the path {name!r}"
        )
    subscriptions = sync_email_subscriptions(settings.group_topic_arn, group)
    put_group(settings.table_name, group, caller, datetime.now(UTC))
    return {"group": group.model_dump(mode="json"), "email_subscriptions": subscriptions}


def show_group(settings: GroupApiSettings, name: str, caller: str) -> Group:
    _require_admin(settings, caller)
    return get_group(settings.table_name, name)


def _email_subscriptions(topic_arn: str) -> tuple[dict[str, tuple[str, list[str]]], set[str]]:
    """(address → (subscription ARN, groups of its filter policy) for the confirmed ones, the
    addresses still pending confirmation). A pending subscription is listed without its ARN
    ("PendingConfirmation", ListSubscriptionsByTopic), so neither its filter policy can be read
    nor changed until its address confirms."""
    sns = client("sns")
    found: dict[str, tuple[str, list[str]]] = {}
    pending: set[str] = set()
    kwargs: dict[str, Any] = {"TopicArn": topic_arn}
    while True:
        page = sns.list_subscriptions_by_topic(**kwargs)
        for sub in page.get("Subscriptions", []):
            arn = sub.get("SubscriptionArn", "")
            if sub.get("Protocol") != "email":
                continue
            if not arn.startswith("arn:"):
                pending.add(sub["Endpoint"].lower())
                continue
            policy = (
                sns.get_subscription_attributes(SubscriptionArn=arn)["Attributes"].get("FilterPolicy") or "{}"
            )
            found[sub["Endpoint"].lower()] = (arn, list(json.loads(policy).get("group", [])))
        if not page.get("NextToken"):
            return found, pending
        kwargs["NextToken"] = page["NextToken"]


def sync_email_subscriptions(topic_arn: str, group: Group) -> dict[str, list[str]]:
    sns = client("sns")
    wanted = {a.lower() for c in group.channels if c.kind == "email" for a in c.addresses or ()}
    existing, pending = _email_subscriptions(topic_arn)
    changes: dict[str, list[str]] = {"subscribed": [], "kept": [], "removed": [], "pending": []}
    for address in sorted(wanted - set(existing)):
        try:
            # For an address still pending with this group's filter, SNS sends the confirmation again.
            sns.subscribe(
                TopicArn=topic_arn,
                Protocol="email",
                Endpoint=address,
                ReturnSubscriptionArn=True,
                Attributes={"FilterPolicy": json.dumps({"group": [group.name]})},
            )
        except ClientError as exc:
            # Pending with another group's filter: SNS refuses a second subscription of the address
            # with other attributes. It is set for this group too by an apply after the confirmation.
            if address not in pending or error_code(exc) != "InvalidParameter":
                raise
            changes["pending"].append(address)
            continue
        changes["pending" if address in pending else "subscribed"].append(address)
    for address, (arn, groups) in sorted(existing.items()):
        now_in = sorted((set(groups) - {group.name}) | ({group.name} if address in wanted else set()))
        if now_in == sorted(groups):
            if address in wanted:
                changes["kept"].append(address)
            continue
        if now_in:
            sns.set_subscription_attributes(
                SubscriptionArn=arn,
                AttributeName="FilterPolicy",
                AttributeValue=json.dumps({"group": now_in}),
            )
        else:
            sns.unsubscribe(SubscriptionArn=arn)
        changes["subscribed" if address in wanted else "removed"].append(address)
    return changes


def test_group(
    settings: GroupApiSettings,
    name: str,
    caller: str,
    transport: Transport,
    clock: Clock,
    secret: Callable[[str], str],
) -> dict[str, Any]:
    """One test message per channel, sent now; each one's outcome, also as a delivery record."""
    _require_admin(settings, caller)
    group = get_group(settings.table_name, name)
    notice = Notice(
        GroupEvent.JOB_WAITING,
        f"Relevo test message for group {name}",
        reason=f"sent by {caller}: `relevo group test {name}`",
    )
    policy = SendPolicy(
        settings.connect_timeout_sec,
        settings.read_timeout_sec,
        settings.attempts,
        settings.send_budget_sec,
        settings.backoff_base_sec,
    )
    # One deadline for every channel: several that hang one after another would outlast API
    # Gateway's 29 s, and the caller would see a 504 instead of each channel's outcome.
    deadline = clock.now() + settings.test_budget_sec
    results = []
    for index, channel in enumerate(group.channels):
        began = clock.now()
        http_status, error, attempts = None, None, 1
        if channel.kind == "slack":
            assert channel.webhook_secret_ref is not None  # the group model requires it of a Slack channel
            try:
                url = secret(channel.webhook_secret_ref)
            except Exception as exc:  # reported, not raised: the other channels are still tried
                error = f"the secret {channel.webhook_secret_ref} cannot be read ({type(exc).__name__})"
            else:
                result = send(
                    OutgoingRequest("slack", "POST", url, slack_message(notice)),
                    policy,
                    transport,
                    clock,
                    deadline,
                )
                http_status = result.last.http_status if result.attempts else None
                attempts = max(1, len(result.attempts))
                error = None if result.delivered else result.reason
        else:
            subject, body = email_message(notice)
            try:
                client("sns").publish(
                    TopicArn=settings.group_topic_arn,
                    Subject=subject,
                    Message=body,
                    MessageAttributes={"group": {"DataType": "String", "StringValue": name}},
                )
            except Exception as exc:  # reported, not raised
                error = f"SNS publish failed ({type(exc).__name__})"
        ended = clock.now()
        outcome = Outcome.DELIVERED if error is None else Outcome.FAILED
        record = DeliveryRecord(
            direction=Direction.OUTGOING,
            project=f"group:{name}",
            target=channel.kind,
            event="test",
            outcome=outcome,
            at=datetime.fromtimestamp(ended, UTC).isoformat(timespec="milliseconds"),
            http_status=http_status,
            attempt=attempts,
            latency_ms=int((ended - began) * 1000),
            reason=None if error is None else error[:512],
        )
        record_delivery(settings.table_name, record, ttl=int(ended) + settings.delivery_record_days * DAY)
        results.append(
            {
                "channel": index,
                "kind": channel.kind,
                "outcome": outcome.value,
                "http_status": http_status,
                "reason": error,
            }
        )
    return {"group": name, "results": results}
