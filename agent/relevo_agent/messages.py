"""One message of a region's work queue as this agent received it: what SQS says about it (its
receive count and send time) and what the agent does with it (delete it once claimed, hide it for
a while, hand it back). The poll (relevo_agent.service), the hand-back to another agent
(relevo_agent.presence) and the stage run (relevo_agent.stage) all go through it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from relevo_core.aws import client, error_code
from relevo_core.lease_timeline import RETRY_AFTER_FAILURE_SEC

log = logging.getLogger(__name__)

# The system attributes every receive asks for: what sent_at and receive_count read.
RECEIVE_ATTRIBUTES = ["SentTimestamp", "ApproximateReceiveCount"]
# A message put back on the queue by an agent that does not meet its stage's `requires` (resend)
# carries the first send time, so sent_at (the stage's enqueued_at, the hand-back's wait) stays.
FIRST_SENT_ATTRIBUTE = "relevo_first_sent_ms"


def receive(queue_url: str, wait_sec: int) -> list[Message]:
    """One long poll for at most one message. Errors are the caller's (the poll loop's)."""
    response = client("sqs").receive_message(
        QueueUrl=queue_url,
        MaxNumberOfMessages=1,
        WaitTimeSeconds=wait_sec,
        MessageSystemAttributeNames=RECEIVE_ATTRIBUTES,
        MessageAttributeNames=[FIRST_SENT_ATTRIBUTE],
    )
    return [Message(queue_url, raw) for raw in response.get("Messages", [])]


@dataclass(frozen=True)
class Message:
    """A received message (`raw`: the SQS ReceiveMessage entry) of the queue at `queue_url`."""

    queue_url: str
    raw: dict[str, Any]

    @property
    def body(self) -> str:
        return self.raw["Body"]

    @property
    def receipt_handle(self) -> str:
        return self.raw["ReceiptHandle"]

    @property
    def message_id(self) -> str | None:
        return self.raw.get("MessageId")

    @property
    def receive_count(self) -> int:
        """How often SQS has handed this message out, this receive included."""
        return int(self.raw.get("Attributes", {}).get("ApproximateReceiveCount", 1))

    @property
    def sent_at(self) -> datetime | None:
        """When SQS first accepted the message (its SentTimestamp attribute, epoch milliseconds; for
        a resent one, the first send's)."""
        first = self.raw.get("MessageAttributes", {}).get(FIRST_SENT_ATTRIBUTE, {}).get("StringValue")
        sent_ms = first or self.raw.get("Attributes", {}).get("SentTimestamp")
        return datetime.fromtimestamp(int(sent_ms) / 1000, UTC) if sent_ms else None

    def hide_for(self, seconds: int) -> None:
        """Invisible for `seconds` from now (ChangeMessageVisibility). Errors are the caller's."""
        client("sqs").change_message_visibility(
            QueueUrl=self.queue_url, ReceiptHandle=self.receipt_handle, VisibilityTimeout=seconds
        )

    def give_back(self) -> None:
        """Visible again at once ("ChangeMessageVisibility": VisibilityTimeout 0, the minimum)."""
        self.give_back_after(0)

    def give_back_after(self, seconds: int, tries: int = 3) -> None:
        """Tried again after a transient error: a message left alone waits out the work queue's
        60 s visibility timeout, which a retry's queue timeout may not afford."""
        for attempt in range(tries):
            try:
                self.hide_for(seconds)
                return
            except ClientError as exc:
                if error_code(exc) == "ReceiptHandleIsInvalid":
                    return  # deleted meanwhile (the claim it led to did)
            except BotoCoreError:
                pass
            time.sleep(RETRY_AFTER_FAILURE_SEC * 2**attempt)
        log.warning("could not hand a stage message back; it returns after its visibility timeout")

    def resend(self, delay_sec: int) -> None:
        """Put a copy back on the queue, visible after `delay_sec` (an SQS message timer, 0 to 900 s:
        "Amazon SQS message timers", SQS Developer Guide), then delete this one. Unlike a hand-back
        (ChangeMessageVisibility), the copy starts with a receive count of 0, so however often agents
        that cannot run the stage pass it on, it never reaches the work queue's redrive DLQ
        (maxReceiveCount 5). If the delete fails, both copies exist: the claim's conditional write
        takes one and refuses the other, as for any SQS redelivery. Errors of the send are the
        caller's (nothing was changed)."""
        first_ms = int(self.sent_at.timestamp() * 1000) if self.sent_at else int(time.time() * 1000)
        client("sqs").send_message(
            QueueUrl=self.queue_url,
            MessageBody=self.body,
            DelaySeconds=max(0, min(900, delay_sec)),
            MessageAttributes={FIRST_SENT_ATTRIBUTE: {"DataType": "Number", "StringValue": str(first_ms)}},
        )
        self.delete()

    def delete(self) -> None:
        """The claim is the durable record; the message has done its job. A failed delete only
        means a second delivery later, which the claim refuses while this attempt's lease lives."""
        try:
            client("sqs").delete_message(QueueUrl=self.queue_url, ReceiptHandle=self.receipt_handle)
        except (ClientError, BotoCoreError) as exc:
            log.warning(
                "could not delete a claimed stage message (%s); the claim refuses its redelivery", exc
            )
