"""An accepted claim starts its command at once. The run token's handing (the stage record says
when; the token stays in the job's token partition) and the claimed message's deletion are seen
to beside the command (relevo_agent.claim, Claims.watch_for_run_token); these tests
drive that watcher against the embedded stack with a stage the state machine dispatched. The
dispatch is claimed but never answered, so the state machine itself hands out no run token: each
test decides what happens instead.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from botocore.exceptions import ClientError

from relevo_agent.attempt import StageRun
from relevo_agent.claim import new_claim_secret
from relevo_agent.config import AgentConfig
from relevo_agent.journal import Journal, Operation, OperationOutcome, operation_id
from relevo_agent.lease import Lease
from relevo_agent.messages import Message
from relevo_agent.service import Agent
from relevo_cli.api import RelevoApi
from relevo_core.aws import client
from relevo_core.lease_timeline import LeaseTimeline
from relevo_core.models.agent_session import ClaimRequest
from relevo_core.models.status import StageStatus
from relevo_core.store import stage_attempts
from relevo_core.store.codec import from_attributes
from tests.helpers.stack import receive_stage, wait_until
from tests.helpers.state_machine import start_job

LEASE_TTL_SEC = 60  # no renewal or heartbeat falls inside a test


class Claimed:
    """A dispatched stage claimed by agent mac-k, its keeper not yet started."""

    def __init__(self, stack, project_id: str, tmp_path: Path) -> None:
        self.stack = stack
        self.job_id = start_job(stack, project_id)
        task, self.receipt_handle = receive_stage(stack, self.job_id)
        self.queue_url = stack.work_queues["eu-west"]
        self.ref = stage_attempts.StageRef(
            stack.table_name, self.job_id, task["stage_index"], task["attempt"], "mac-k"
        )
        config = AgentConfig(
            agent_id="mac-k",
            region="eu-west",
            capacity=1,
            workspace_root=tmp_path,
            journal=tmp_path / "j.sqlite3",
        )
        self.agent = Agent(
            config, stack.table_name, self.queue_url, Journal(config.journal), api_url=stack.api_url
        )
        # Claimed through the claim route, as the agent claims: its job credentials are held.
        secret = new_claim_secret()
        granted = self.agent.sessions.routes.claim(
            ClaimRequest(
                job_id=self.job_id,
                stage_index=task["stage_index"],
                attempt=task["attempt"],
                agent_id="mac-k",
                claim_secret=secret,
                dispatch_key=task["dispatch_key"],
                dispatch_token=task["task_token"],
                accept=False,
            )
        )
        self.agent.sessions.granted(
            (self.job_id, task["stage_index"], task["attempt"]), secret, granted.session
        )
        self.op_id = operation_id(self.job_id, task["stage"])
        self.agent.journal.begin(
            Operation(
                self.op_id,
                self.job_id,
                task["stage"],
                task["stage_index"],
                task["attempt"],
                str(tmp_path),
                "commit=c;inputs=0",
                claim_secret=secret,
            )
        )
        self.run = StageRun(
            self.ref, Lease(LeaseTimeline(LEASE_TTL_SEC, 10, 5), time.monotonic()), claim_secret=secret
        )
        self.keeper = threading.Thread(
            target=self.agent.stages.claims.watch_for_run_token,
            args=(self.run, self.op_id, Message(self.queue_url, {"ReceiptHandle": self.receipt_handle})),
            daemon=True,
        )

    def hand_out_run_token(self) -> None:
        """What the state machine's AwaitResult writes on the stage record once it has taken the
        claim (the token itself goes to the job's token partition, which the agent never reads)."""
        client("dynamodb").update_item(
            TableName=self.stack.table_name,
            Key=self.ref.key,
            UpdateExpression="SET run_handed_at = :now",
            **stage_attempts.holds_attempt_check(self.ref, **{":now": {"S": datetime.now(UTC).isoformat()}}),
        )

    def stage_record(self) -> dict:
        return from_attributes(
            client("dynamodb").get_item(
                TableName=self.stack.table_name, Key=self.ref.key, ConsistentRead=True
            )["Item"]
        )

    def message_deleted(self) -> bool:
        try:
            client("sqs").change_message_visibility(
                QueueUrl=self.queue_url, ReceiptHandle=self.receipt_handle, VisibilityTimeout=30
            )
        except ClientError as exc:
            return exc.response["Error"]["Code"] == "ReceiptHandleIsInvalid"
        return False

    def stop(self) -> None:
        self.run.done.set()
        if self.keeper.is_alive():
            self.keeper.join(10)


@pytest.fixture()
def claimed(local_stack, project_id, tmp_path: Path):
    claim = Claimed(local_stack, project_id, tmp_path)
    yield claim
    claim.stop()


def test_the_keeper_sees_the_run_token_handed_and_then_deletes_the_message(claimed: Claimed):
    claimed.keeper.start()
    assert not claimed.run.token_known.wait(0.5)  # nothing handed out yet: still looking
    assert not claimed.message_deleted()

    claimed.hand_out_run_token()

    assert claimed.run.token_known.wait(10)
    assert claimed.run.run_handed is True
    assert claimed.run.reason is None  # the command keeps running
    wait_until(claimed.message_deleted, 10, "the claimed message deleted")


def test_a_job_canceled_before_its_run_token_came_stops_the_command(claimed: Claimed):
    claimed.keeper.start()
    RelevoApi.for_stack(claimed.stack).cancel_job(claimed.job_id)

    wait_until(lambda: claimed.run.reason is not None, 15, "the keeper stopping the stage")
    assert claimed.run.reason == "canceled"
    assert claimed.run.cancel.is_set() and claimed.run.token_known.is_set()
    assert claimed.run.run_handed is False


def test_a_stage_taken_over_before_its_run_token_came_stops_the_command(claimed: Claimed):
    claimed.keeper.start()
    successor = stage_attempts.StageRef(
        claimed.stack.table_name, claimed.job_id, claimed.ref.stage_index, claimed.ref.attempt + 1, "mac-z"
    )
    stage_attempts.claim(successor, LEASE_TTL_SEC, datetime.now(UTC))

    wait_until(lambda: claimed.run.reason is not None, 15, "the keeper stopping the stage")
    assert claimed.run.reason == "lease_lost"
    assert claimed.run.run_handed is False


def test_a_result_without_a_run_token_is_still_journaled_and_its_fenced_stage_write_made(claimed: Claimed):
    """A command can end before the token is decided (here it never comes): the receipt is the
    local truth a later attempt reconciles from, so it is journaled and reported all the same."""
    claimed.run.token_known.set()  # decided, and no token
    receipt = {"exit_code": 0, "artifacts": {}, "agent_id": "mac-k", "attempt": claimed.ref.attempt}

    claimed.agent.stages.concluder.conclude(
        claimed.run, claimed.op_id, StageStatus.SUCCEEDED, OperationOutcome.SUCCEEDED, receipt, exit_code=0
    )

    operation = claimed.agent.journal.get(claimed.op_id)
    assert (operation.outcome, operation.receipt) == (OperationOutcome.SUCCEEDED, receipt)
    assert claimed.agent.journal.pending() == []
    record = claimed.stage_record()
    assert (record["status"], record["outcome"], record["receipt"]) == (
        StageStatus.SUCCEEDED.value,
        "succeeded",
        receipt,
    )
