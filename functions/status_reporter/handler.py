"""Table change stream → commit statuses (GitHub, GitLab), once per job transition. Partial batch
failures are reported per record; a remote service's failure is dead-lettered, never raised."""

from __future__ import annotations

import time

from aws_lambda_powertools.utilities import parameters
from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.data_classes.dynamo_db_stream_event import DynamoDBRecord

from relevo_core.config.notify import notify_settings
from relevo_core.models.errors import RelevoError
from relevo_core.notify.reporter import Reporter
from relevo_core.notify.sending import Clock, Urllib3Transport
from relevo_core.observability import lambda_entry
from relevo_core.store.codec import from_attributes
from relevo_core.store.projects import get_project

# Stop starting deliveries this long before the function's timeout: what is left is dead-lettered.
_DEADLINE_MARGIN_SEC = 5.0

processor = BatchProcessor(event_type=EventType.DynamoDBStreams)
_reporter: Reporter | None = None
_deadline = 0.0


def _project(project_id: str):  # type: ignore[no-untyped-def]
    try:
        return get_project(notify_settings().table_name, project_id)
    except RelevoError:
        return None  # deleted since: nothing to report to


def _secret(name: str) -> str:
    return str(parameters.get_secret(name, max_age=notify_settings().secret_max_age_sec))


def reporter() -> Reporter:
    global _reporter
    if _reporter is None:
        _reporter = Reporter(notify_settings(), Urllib3Transport(), Clock(), project=_project, secret=_secret)
    return _reporter


def record_handler(record: DynamoDBRecord) -> None:
    change = record.raw_event.get("dynamodb") or {}
    old, new = change.get("OldImage"), change.get("NewImage")
    reporter().report_change(from_attributes(old) if old else None, from_attributes(new) if new else None, _deadline)


@lambda_entry(correlation_id_path=None)
def lambda_handler(event, context):
    global _deadline
    _deadline = time.time() + context.get_remaining_time_in_millis() / 1000 - _DEADLINE_MARGIN_SEC
    return process_partial_response(event=event, record_handler=record_handler, processor=processor, context=context)
