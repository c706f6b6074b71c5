"""The table's change stream, delivered as AWS would deliver it, becomes the job metrics:
functions/status_reporter/handler.py (the stream's reader for reports and metrics alike) run,
with its deployed environment, on the records of a real job's execution that its event source's
filters let through."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from relevo_core.aws import client
from relevo_core.config.notify import notify_settings
from relevo_local import template
from relevo_local.streams import record_filter
from tests.helpers.stack import (
    LambdaContext,
    emf_values,
    job_stream_records,
    load_handler,
    metrics_printed,
    receive_stage,
    stream_captured,
    wait_for_execution,
)
from tests.helpers.state_machine import agent_runs, start_job

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def reporter_handler(local_stack, monkeypatch):
    deployed = client("lambda").get_function_configuration(
        FunctionName=local_stack.resources["StatusReporterFunction"]
    )
    for name, value in deployed["Environment"]["Variables"].items():
        if not name.startswith("AWS_"):
            monkeypatch.setenv(name, str(value))
    metrics_printed(monkeypatch)
    notify_settings.cache_clear()
    yield load_handler("status_reporter")
    notify_settings.cache_clear()


def _delivered(records: list[dict]) -> list[dict]:
    """The records the function's event source mapping passes on (its FilterCriteria)."""
    sam = template.load_sam_template(ROOT / "template.yaml")
    [reporter] = [fn for fn in template.sam_functions(sam, ROOT) if fn.logical_id == "StatusReporterFunction"]
    passes = record_filter(reporter.streams[0][3])
    return [record for record in records if passes(record)]


def test_a_finished_job_stream_becomes_outcome_latency_and_retry_metrics(
    local_stack, project_id, reporter_handler, capsys
):
    with stream_captured(local_stack) as batches:
        job_id = start_job(local_stack, project_id)
        for _ in ("build", "sign"):
            task, _ = receive_stage(local_stack, job_id)
            agent_runs(local_stack, task)
        assert wait_for_execution(local_stack, job_id)["status"] == "SUCCEEDED"

        def ours() -> list[dict]:
            return job_stream_records(batches, job_id)

        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not any(
            r["dynamodb"].get("NewImage", {}).get("status", {}).get("S") == "succeeded"
            and r["dynamodb"]["Keys"]["sk"]["S"] == "JOB"
            for r in ours()
        ):
            time.sleep(0.2)

    records = _delivered(ours())
    assert records, "the stream delivered none of the job's records"
    capsys.readouterr()
    response = reporter_handler({"Records": records}, LambdaContext("StatusReporterFunction"))
    assert response == {"batchItemFailures": []}
    values = emf_values(capsys.readouterr().out)
    assert values["JobsSucceeded"] == [1]
    assert len(values["HandoffLatencyMs"]) == 2 and all(v >= 0 for v in values["HandoffLatencyMs"])
    assert values["RetryCount"] == [0, 0]
    assert len(values["JobDurationMs"]) == 1 and values["JobDurationMs"][0] > 0
    assert "JobsFailed" not in values
