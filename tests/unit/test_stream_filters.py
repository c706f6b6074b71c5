"""The local stack's stream pollers apply each event source's FilterCriteria from template.yaml
as Lambda does (relevo_local.streams.record_filter), so a stream function is invoked for the
records its filters name and no other (MetricsFunction and StatusReporterFunction were invoked for
every write of the table: every log chunk and lease renewal)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import pytest

from relevo_core.jobs.metrics import metrics_for_change
from relevo_core.models.status import StageStatus
from relevo_core.notify.transitions import reported_stage_change
from relevo_local import template
from relevo_local.streams import record_filter

ROOT = Path(__file__).resolve().parents[2]


@lru_cache(maxsize=1)
def _filters() -> dict[str, tuple[str, ...]]:
    sam = template.load_sam_template(ROOT / "template.yaml")
    return {fn.logical_id: fn.streams[0][3] for fn in template.sam_functions(sam, ROOT) if fn.streams}


def _record(pk: str, sk: str, **new_image) -> dict:
    return {
        "eventName": "MODIFY",
        "dynamodb": {"Keys": {"pk": {"S": pk}, "sk": {"S": sk}}, "NewImage": new_image},
    }


def _change(pk: str, sk: str, old_status: str, new_status: str) -> dict:
    record = _record(pk, sk, status={"S": new_status})
    record["dynamodb"]["OldImage"] = {"status": {"S": old_status}}
    return record


@pytest.mark.parametrize(
    "function, record, sent",
    [
        ("StatusReporterFunction", _record("LOGS#j1", "CHUNK#0000000001"), False),
        # A lease renewal: the status stays, nothing to report or count.
        ("StatusReporterFunction", _change("STAGES#j1", "STAGE#00", "running", "running"), False),
        # Claimed after a reconciliation, and resolved by a person: counted by the metrics.
        ("StatusReporterFunction", _change("STAGES#j1", "STAGE#00", "reconciled", "running"), True),
        ("StatusReporterFunction", _change("STAGES#j1", "STAGE#00", "manual_review", "succeeded"), True),
        ("StatusReporterFunction", _record("JOB#j1", "JOB", status={"S": "waiting"}), True),
        ("StatusReporterFunction", _record("STAGES#j1", "STAGE#000"), False),
        # A stage starting and ending (a check run's summary per stage); a lease renewal, not.
        ("StatusReporterFunction", _change("STAGES#j1", "STAGE#00", "dispatched", "running"), True),
        ("StatusReporterFunction", _change("STAGES#j1", "STAGE#00", "running", "succeeded"), True),
        ("StatusReporterFunction", _change("STAGES#j1", "STAGE#00", "dispatched", "canceled"), True),
        ("StatusReporterFunction", _change("STAGES#j1", "STAGE#00", "running", "running"), False),
        ("StatusReporterFunction", _change("STAGES#j1", "STAGE#00", "pending", "dispatched"), False),
        ("StatusReporterFunction", _record("AGENTS#eu-west", "AGENT#mac-1", online={"BOOL": False}), True),
        ("StatusReporterFunction", _record("AGENTS#eu-west", "AGENT#mac-1", online={"BOOL": True}), False),
        # artifact.max_total_bytes: every artifact record change (a delete too), and jobs that ended.
        ("ArtifactQuotaFunction", _record("ARTIFACTS#j1", "build#app.ipa", size={"N": "10"}), True),
        (
            "ArtifactQuotaFunction",
            {
                "eventName": "REMOVE",
                "dynamodb": {"Keys": {"pk": {"S": "ARTIFACTS#j1"}, "sk": {"S": "build#a"}}},
            },
            True,
        ),
        ("ArtifactQuotaFunction", _record("JOB#j1", "JOB", status={"S": "canceled"}), True),
        ("ArtifactQuotaFunction", _record("JOB#j1", "JOB", status={"S": "running"}), False),
        ("ArtifactQuotaFunction", _record("LOGS#j1", "CHUNK#0000000001"), False),
        ("ArtifactQuotaFunction", _record("USAGE#p", "ARTIFACTS", bytes={"N": "10"}), False),
        # The sweeper's record of the region's change to none online, and back.
        ("StatusReporterFunction", _record("AGENTS#eu-west", "ONLINE_AGENTS", online={"BOOL": False}), True),
        ("StatusReporterFunction", _record("AGENTS#eu-west", "ONLINE_AGENTS", online={"BOOL": True}), False),
    ],
)
def test_a_record_reaches_a_stream_function_only_when_one_of_its_filters_matches(function, record, sent):
    assert record_filter(_filters()[function])(record) is sent


def test_an_event_source_without_filters_gets_every_record():
    assert record_filter(())(_record("LOGS#j1", "CHUNK#1")) is True


def test_no_stream_function_has_more_filters_than_lambda_allows_by_default():
    """Lambda refuses an event source mapping with more filters than its quota, five by default
    ("Control which events Lambda sends to your function")."""
    assert all(len(filters) <= 5 for filters in _filters().values()), _filters()


# The status reporter's stage filters before the same function also read the stream for the
# metrics (template.yaml at 3d1854d): the stage changes it reported then, and must report now.
REPORTED_STAGE_CHANGES = (
    '{"dynamodb": {"Keys": {"sk": {"S": [{"prefix": "STAGE#"}]}}, "OldImage": {"status": {"S": ["pending", '
    '"dispatched"]}}, "NewImage": {"status": {"S": ["running"]}}}}',
    '{"dynamodb": {"Keys": {"sk": {"S": [{"prefix": "STAGE#"}]}}, "OldImage": {"status": {"S": ["pending", '
    '"dispatched", "running", "unknown", "reconciled"]}}, '
    '"NewImage": {"status": {"S": ["succeeded", "warning", "failed", "skipped", "canceled", '
    '"manual_review"]}}}}',
)
STATUSES = [None, *(status.value for status in StageStatus)]


def _stage_change(
    old_status: str | None, new_status: str | None, old_attempt: int = 1, new_attempt: int = 1
) -> tuple[dict, dict | None, dict]:
    """(stream record, old image, new image) of one change of a stage record."""
    old = (
        None
        if old_status is None
        else {
            "pk": "STAGES#j1",
            "sk": "STAGE#00",
            "status": old_status,
            "attempt": old_attempt,
            "dispatched_at": "2026-12-01T10:00:00+00:00",
        }
    )
    new = {
        "pk": "STAGES#j1",
        "sk": "STAGE#00",
        "attempt": new_attempt,
        "dispatched_at": "2026-12-01T10:00:00+00:00",
        "started_at": "2026-12-01T10:00:01+00:00",
        "retry_count": 0,
        **({"status": new_status} if new_status else {}),
    }
    record = {
        "eventName": "MODIFY" if old else "INSERT",
        "dynamodb": {
            "Keys": {"pk": {"S": "STAGES#j1"}, "sk": {"S": "STAGE#00"}},
            "NewImage": {"status": {"S": new_status}} if new_status else {},
        },
    }
    if old_status is not None:
        record["dynamodb"]["OldImage"] = {"status": {"S": old_status}}
    return record, old, new


@pytest.mark.parametrize("old_status", STATUSES)
@pytest.mark.parametrize("new_status", STATUSES)
def test_the_reporter_reports_the_stage_changes_it_reported_while_it_read_the_stream_alone(
    old_status, new_status
):
    record, old, new = _stage_change(old_status, new_status)

    assert reported_stage_change(old, new) is record_filter(REPORTED_STAGE_CHANGES)(record)


@pytest.mark.parametrize("old_status", STATUSES)
@pytest.mark.parametrize("new_status", STATUSES)
@pytest.mark.parametrize("new_attempt", [1, 2])
def test_every_stage_change_a_metric_counts_reaches_the_function_that_counts_it(
    old_status, new_status, new_attempt
):
    """MetricsFunction read every job and stage change; its metrics now come from the status
    reporter's function, whose filters must pass each change that counts one."""
    record, old, new = _stage_change(old_status, new_status, new_attempt=new_attempt)
    if not metrics_for_change(old, new):
        return
    if old_status is None:
        # A stage record comes into being only as MarkStageDispatched's update (status
        # dispatched): a claim and a finish both require it to exist.
        assert new_status != StageStatus.DISPATCHED.value
        return
    if old_status == new_status == StageStatus.RUNNING.value:
        # The metrics count a claim of a later attempt over a running one; the filters cannot
        # see an attempt change, and need not: a later attempt is dispatched first
        # (MarkStageDispatched sets dispatched), so its claim changes the status.
        assert new_attempt == 2
        return
    assert record_filter(_filters()["StatusReporterFunction"])(record), (old_status, new_status)


def test_the_table_stream_has_at_most_two_readers():
    """Lambda reads one DynamoDB stream shard with at most two functions; a third is throttled
    ("Concurrent shard reads in DynamoDB Streams", Lambda Developer Guide), and filters do not
    help: each event source mapping reads every record to filter it."""
    readers = [name for name, filters in _filters().items()]
    assert len(readers) <= 2, readers


def test_the_local_stack_refuses_a_third_reader_of_a_stream():
    """Where AWS would take the third event source mapping and then throttle its reads."""
    from relevo_local.streams import StreamConsumer, StreamPoller, TooManyStreamReaders

    def reader(name: str) -> StreamConsumer:
        return StreamConsumer(name, 10, invoke=lambda event: None)

    poller = StreamPoller.reading_for(
        None, "arn:aws:dynamodb:us-east-1:123456789012:table/t/stream/1", reader("first")
    )
    poller.add_consumer(reader("second"))
    with pytest.raises(TooManyStreamReaders, match="reader number 3 .*more than 2 Lambda readers"):
        poller.add_consumer(reader("third"))
    assert [consumer.name for consumer in poller.consumers] == ["first", "second"]
