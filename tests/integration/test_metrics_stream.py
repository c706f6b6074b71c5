"""The table's change stream, delivered as AWS would deliver it, becomes the job metrics:
functions/metrics/handler.py run on the records a real job's execution wrote."""

from __future__ import annotations

import time

import pytest

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


@pytest.fixture
def metrics_handler(monkeypatch):
    metrics_printed(monkeypatch)
    return load_handler("metrics")


def test_a_finished_job_stream_becomes_outcome_latency_and_retry_metrics(local_stack, project_id, metrics_handler, capsys):
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

    records = ours()
    assert records, "the stream delivered none of the job's records"
    capsys.readouterr()
    response = metrics_handler({"Records": records}, LambdaContext("MetricsFunction"))
    assert response == {"batchItemFailures": []}
    values = emf_values(capsys.readouterr().out)
    assert values["JobsSucceeded"] == [1]
    assert len(values["HandoffLatencyMs"]) == 2 and all(v >= 0 for v in values["HandoffLatencyMs"])
    assert values["RetryCount"] == [0, 0]
    assert len(values["JobDurationMs"]) == 1 and values["JobDurationMs"][0] > 0
    assert "JobsFailed" not in values
