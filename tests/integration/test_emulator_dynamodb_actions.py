"""The emulator applies DynamoDB actions one at a time, as DynamoDB applies a conditional write
atomically ("Condition expressions", DynamoDB Developer Guide: a conditional write succeeds only
if the item's attributes meet the condition when it is applied), while the rest of each request
(parsing, authorization, the answer's serialization) runs side by side
(relevo_local.moto.dynamodb.apply_dynamodb_actions_one_at_a_time)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from botocore.exceptions import ClientError

pytestmark = pytest.mark.integration


def test_of_racing_conditional_writes_on_one_item_exactly_one_passes_its_condition(local_stack) -> None:
    from relevo_core.aws import client

    dynamodb, table = client("dynamodb"), local_stack.table_name
    key = {"pk": {"S": "TEST#race"}, "sk": {"S": "ITEM"}}
    dynamodb.put_item(TableName=table, Item={**key, "version": {"N": "0"}})
    start = threading.Barrier(12)

    def bump(version: int) -> bool:
        start.wait()
        try:
            dynamodb.update_item(
                TableName=table,
                Key=key,
                UpdateExpression="SET version = :next",
                ConditionExpression="version = :seen",
                ExpressionAttributeValues={":seen": {"N": str(version)}, ":next": {"N": str(version + 1)}},
            )
        except ClientError as exc:
            assert exc.response["Error"]["Code"] == "ConditionalCheckFailedException"
            return False
        return True

    with ThreadPoolExecutor(max_workers=12) as pool:
        for version in range(5):
            passed = list(pool.map(bump, [version] * 12))
            start.reset()
            assert passed.count(True) == 1, (
                f"round {version}: {passed.count(True)} writes passed the same condition"
            )
    assert dynamodb.get_item(TableName=table, Key=key, ConsistentRead=True)["Item"]["version"] == {"N": "5"}


def test_an_action_waits_for_the_one_being_applied(local_stack) -> None:
    from relevo_core.aws import client
    from relevo_local.moto.dynamodb import DYNAMODB_ACTIONS

    dynamodb, table = client("dynamodb"), local_stack.table_name
    key = {"pk": {"S": "TEST#held"}, "sk": {"S": "ITEM"}}
    dynamodb.put_item(TableName=table, Item={**key, "n": {"N": "1"}})
    answered = threading.Event()

    def read() -> None:
        dynamodb.get_item(TableName=table, Key=key, ConsistentRead=True)
        answered.set()

    with DYNAMODB_ACTIONS:  # an action of another request being applied
        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        assert not answered.wait(0.3), "the read was applied while another action held the backend"
    assert answered.wait(10)
    reader.join()
