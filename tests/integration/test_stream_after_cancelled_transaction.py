"""A cancelled TransactWriteItems leaves the table's stream as it was, and every reader of the
stream keeps reading it (DynamoDB: a cancelled transaction writes nothing, to the table or its
stream). moto 5.2.5 rolls a cancelled transaction back by putting a copy of the table in place,
stream included: readers holding an iterator of the old stream then saw nothing more, so a
duplicate webhook delivery silently stopped every stream consumer of the local stack."""

from __future__ import annotations

import secrets

import pytest
from botocore.exceptions import ClientError

from relevo_core.aws import client
from relevo_local.streams import StreamPoller


def test_a_cancelled_transaction_neither_writes_to_the_stream_nor_cuts_off_its_readers(local_stack):
    dynamodb, table = client("dynamodb"), local_stack.table_name
    arn = dynamodb.describe_table(TableName=table)["Table"]["LatestStreamArn"]
    seen: list[str] = []
    poller = StreamPoller(
        client("dynamodbstreams"),
        arn,
        100,
        lambda e: seen.extend(r["dynamodb"]["Keys"]["pk"]["S"] for r in e["Records"]),
        "t",
    )
    poller._discover_shards("LATEST")
    tag = secrets.token_hex(4)

    def put(pk: str) -> None:
        dynamodb.put_item(TableName=table, Item={"pk": {"S": pk}, "sk": {"S": "T"}})

    put(f"T#{tag}#before")
    with pytest.raises(ClientError) as cancelled:
        dynamodb.transact_write_items(
            TransactItems=[
                {"Put": {"TableName": table, "Item": {"pk": {"S": f"T#{tag}#in-tx"}, "sk": {"S": "T"}}}},
                {
                    "Put": {
                        "TableName": table,
                        "Item": {"pk": {"S": f"T#{tag}#before"}, "sk": {"S": "T"}},
                        "ConditionExpression": "attribute_not_exists(pk)",
                    }
                },
            ]
        )
    assert cancelled.value.response["Error"]["Code"] == "TransactionCanceledException"
    put(f"T#{tag}#after")
    poller.poll_once()
    poller.poll_once()
    assert [pk for pk in seen if tag in pk] == [f"T#{tag}#before", f"T#{tag}#after"]
