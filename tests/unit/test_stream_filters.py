"""The local stack's stream pollers apply each event source's FilterCriteria from template.yaml
as Lambda does (relevo_cli.local.streams.record_filter), so a stream function is invoked for the
records its filters name and no other (MetricsFunction and StatusReporterFunction were invoked for
every write of the table: every log chunk and lease renewal)."""

from __future__ import annotations

from pathlib import Path

import pytest

from relevo_cli.local import template
from relevo_cli.local.streams import record_filter

ROOT = Path(__file__).resolve().parents[2]


def _filters() -> dict[str, tuple[str, ...]]:
    sam = template.load_sam_template(ROOT / "template.yaml")
    return {fn.logical_id: fn.streams[0][3] for fn in template.sam_functions(sam, ROOT) if fn.streams}


def _record(pk: str, sk: str, **new_image) -> dict:
    return {"eventName": "MODIFY", "dynamodb": {"Keys": {"pk": {"S": pk}, "sk": {"S": sk}}, "NewImage": new_image}}


def _change(pk: str, sk: str, old_status: str, new_status: str) -> dict:
    record = _record(pk, sk, status={"S": new_status})
    record["dynamodb"]["OldImage"] = {"status": {"S": old_status}}
    return record


@pytest.mark.parametrize(
    "function, record, sent",
    [
        ("MetricsFunction", _record("JOB#j1", "JOB", status={"S": "running"}), True),
        ("MetricsFunction", _record("STAGES#j1", "STAGE#000"), True),
        ("MetricsFunction", _record("LOGS#j1", "CHUNK#0000000001"), False),
        ("MetricsFunction", _record("AGENTS#eu-west", "AGENT#mac-1", online={"BOOL": False}), False),
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
        ("ArtifactQuotaFunction", {"eventName": "REMOVE", "dynamodb": {"Keys": {"pk": {"S": "ARTIFACTS#j1"}, "sk": {"S": "build#a"}}}}, True),
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
