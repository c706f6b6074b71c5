"""Which writes of a job's path cost most (bench/cost.py writes_by_item): each item's writes by
operation, at its size rounded up to 1 KB a WRU and doubled inside a transaction ("DynamoDB read
and write operations", Capacity unit consumption for write operations, DynamoDB Developer Guide)."""

from __future__ import annotations

from typing import Any

from bench import cost


def _key(pk: str, sk: str) -> dict[str, Any]:
    return {"pk": {"S": pk}, "sk": {"S": sk}}


def _call(op: str, params: dict[str, Any], service: str = "dynamodb") -> cost.Call:
    return cost.Call("state_machine", service, op, params, {}, True, "main")


def test_a_job_item_of_three_kilobytes_costs_six_units_in_a_transaction_and_is_listed_first():
    # Given a 2,929 B job item and two stage items of 730 B, written as the job's path writes
    # them: the job item with the queued counter in a transaction, each stage item on its own
    sizes = {
        ("JOB#job_a", "JOB"): 2929,
        ("COUNTER#queued", "COUNTER"): 33,
        ("STAGES#job_a", "STAGE#00"): 730,
        ("STAGES#job_a", "STAGE#01"): 730,
    }
    calls = [
        _call(
            "TransactWriteItems",
            {
                "TransactItems": [
                    {"Update": {"Key": _key("JOB#job_a", "JOB")}},
                    {"Update": {"Key": _key("COUNTER#queued", "COUNTER")}},
                ]
            },
        ),
        _call("UpdateItem", {"Key": _key("STAGES#job_a", "STAGE#00")}),
        _call("UpdateItem", {"Key": _key("STAGES#job_a", "STAGE#01")}),
        _call("SendMessage", {}, service="sqs"),
    ]

    # When the writes are grouped by item
    rows = cost.writes_by_item(calls, sizes)

    # Then the job item's one transactional write is 3 KB twice over, the two stage items one
    # row of 1 WRU each, the counter 2 (its 33 B a whole KB, doubled), the most units first
    assert [(r.item, r.how, r.writes, r.size, r.wru) for r in rows] == [
        ("JOB#*/JOB", "TransactWriteItems (Update)", 1, 2929, 6),
        ("COUNTER#queued/COUNTER", "TransactWriteItems (Update)", 1, 33, 2),
        ("STAGES#*/STAGE#*", "UpdateItem", 2, 730, 2),
    ]


def test_an_items_label_keeps_the_words_of_its_key_and_leaves_out_ids_and_numbers():
    # Given keys of a job, a fleet-wide counter and a delivery
    # When each is labelled / Then ids and numbers are `*` and words are kept
    assert cost.item_label(("COUNTER#queued", "COUNTER")) == "COUNTER#queued/COUNTER"
    assert cost.item_label(("TOKENS#job_1", "RUN#STAGE#03")) == "TOKENS#*/RUN#STAGE#*"
    assert cost.item_label(("DELIVERY#github#d-1", "DELIVERY")) == "DELIVERY#github#*/DELIVERY"
