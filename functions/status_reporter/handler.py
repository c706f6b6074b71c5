"""Table change stream → commit statuses (GitHub, GitLab), group notifications (Slack, email),
once per transition, and CloudWatch metrics (EMF): job outcomes and durations, handoff latency,
retries, cross-region bytes. One function for both, as Lambda reads a stream with at most two
("Concurrent shard reads in DynamoDB Streams"; notify/table_changes). Partial batch failures are
reported per record; a remote service's failure is dead-lettered, never raised. Invoked by hand
with `{"replay": [messages of StatusDeadLetterQueue]}`, it sends those reports again, each unless
a newer one superseded it."""

from __future__ import annotations

import time

from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.data_classes.dynamo_db_stream_event import DynamoDBRecord

from relevo_core.models.delivery import ReportReplay
from relevo_core.notify.reporter import Reporter, reporter_from_environment
from relevo_core.notify.table_changes import on_table_change
from relevo_core.notify.transitions import stream_images
from relevo_core.observability import lambda_entry

# Stop starting deliveries this long before the function's timeout: what is left is dead-lettered.
_DEADLINE_MARGIN_SEC = 5.0

processor = BatchProcessor(event_type=EventType.DynamoDBStreams)
_reporter: Reporter | None = None
_deadline = 0.0


def record_handler(record: DynamoDBRecord) -> None:
    global _reporter
    if _reporter is None:
        _reporter = reporter_from_environment()
    old, new = stream_images(record.raw_event)
    on_table_change(_reporter, old, new, _deadline)


@lambda_entry(correlation_id_path=None, emits_metrics=True)
def lambda_handler(event, context):
    global _deadline, _reporter
    _deadline = time.time() + context.get_remaining_time_in_millis() / 1000 - _DEADLINE_MARGIN_SEC
    if "replay" in event:
        replay = ReportReplay.model_validate(event)
        _reporter = _reporter or reporter_from_environment()
        return {"replayed": [_reporter.replay(message, _deadline) for message in replay.replay]}
    return process_partial_response(
        event=event, record_handler=record_handler, processor=processor, context=context
    )
