"""Table change stream → CloudWatch metrics (EMF): job outcomes and durations, handoff latency,
retries, cross-region bytes. Partial batch failures are reported per record."""

from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.data_classes.dynamo_db_stream_event import DynamoDBRecord

from relevo_core.jobs.metrics import metrics_for_change
from relevo_core.observability import lambda_entry, metrics

processor = BatchProcessor(event_type=EventType.DynamoDBStreams)


def record_handler(record: DynamoDBRecord) -> None:
    change = record.dynamodb
    for point in metrics_for_change(change.old_image if change else None, change.new_image if change else None):
        metrics.add_metric(name=point.name, unit=point.unit, value=point.value)


@lambda_entry(correlation_id_path=None, emits_metrics=True)
def lambda_handler(event, context):
    return process_partial_response(event=event, record_handler=record_handler, processor=processor, context=context)
