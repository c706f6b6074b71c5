"""The table's change stream, delivered as AWS would deliver it, becomes the job metrics:
functions/metrics/handler.py run on the records a real job's execution wrote."""

from __future__ import annotations

import importlib.util
import json
import threading
import time
import uuid
from pathlib import Path

import pytest

from relevo_cli.local.streams import StreamPoller
from relevo_core.aws import client
from tests.integration.helpers import receive_stage, wait_for_execution
from tests.integration.test_job_state_machine import _agent_runs, _start_job

HANDLER = Path(__file__).resolve().parents[2] / "functions" / "metrics" / "handler.py"


class _Context:
    function_name = "relevo-MetricsFunction"
    function_version = "$LATEST"
    memory_limit_in_mb = 256
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:relevo-MetricsFunction"
    log_group_name = "/aws/lambda/relevo-MetricsFunction"
    log_stream_name = "test"
    aws_request_id = str(uuid.uuid4())

    def get_remaining_time_in_millis(self) -> int:
        return 30_000


@pytest.fixture
def metrics_handler(monkeypatch):
    monkeypatch.setenv("POWERTOOLS_SERVICE_NAME", "relevo")
    monkeypatch.setenv("POWERTOOLS_METRICS_NAMESPACE", "Relevo")
    monkeypatch.setenv("POWERTOOLS_TRACE_DISABLED", "true")
    monkeypatch.delenv("POWERTOOLS_METRICS_DISABLED", raising=False)
    # The shared Metrics object may have been built (without a namespace) by an earlier test.
    from relevo_core.observability import metrics

    monkeypatch.setattr(metrics, "namespace", "Relevo")
    spec = importlib.util.spec_from_file_location("metrics_handler", HANDLER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.lambda_handler


def _emf_values(stdout: str) -> dict[str, list[float]]:
    values: dict[str, list[float]] = {}
    for line in stdout.splitlines():
        if not line.startswith("{") or '"_aws"' not in line:
            continue
        document = json.loads(line)
        for directive in document["_aws"]["CloudWatchMetrics"]:
            assert directive["Namespace"] == "Relevo"
            for metric in directive["Metrics"]:
                value = document[metric["Name"]]
                values.setdefault(metric["Name"], []).extend(value if isinstance(value, list) else [value])
    return values


def test_a_finished_job_stream_becomes_outcome_latency_and_retry_metrics(local_stack, project_id, metrics_handler, capsys):
    table = client("dynamodb").describe_table(TableName=local_stack.table_name)["Table"]
    batches: list[dict] = []
    poller = StreamPoller(client("dynamodbstreams"), table["LatestStreamArn"], 100, batches.append, "test")
    stopping = threading.Event()
    poller.start(stopping, interval_sec=0.2)
    try:
        job_id = _start_job(local_stack, project_id)
        for _ in ("build", "sign"):
            task, _ = receive_stage(local_stack, job_id)
            _agent_runs(local_stack, task)
        assert wait_for_execution(local_stack, job_id)["status"] == "SUCCEEDED"

        def ours() -> list[dict]:
            return [r for b in batches for r in b["Records"] if r["dynamodb"]["Keys"]["pk"]["S"] == f"JOB#{job_id}"]

        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not any(
            r["dynamodb"].get("NewImage", {}).get("status", {}).get("S") == "succeeded"
            and r["dynamodb"]["Keys"]["sk"]["S"] == "JOB"
            for r in ours()
        ):
            time.sleep(0.2)
    finally:
        stopping.set()

    records = ours()
    assert records, "the stream delivered none of the job's records"
    capsys.readouterr()
    response = metrics_handler({"Records": records}, _Context())
    assert response == {"batchItemFailures": []}
    values = _emf_values(capsys.readouterr().out)
    assert values["JobsSucceeded"] == [1]
    assert len(values["HandoffLatencyMs"]) == 2 and all(v >= 0 for v in values["HandoffLatencyMs"])
    assert values["RetryCount"] == [0, 0]
    assert len(values["JobDurationMs"]) == 1 and values["JobDurationMs"][0] > 0
    assert "JobsFailed" not in values
