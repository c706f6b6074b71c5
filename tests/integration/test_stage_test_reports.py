"""A stage's test reports on the local stack, by the real agent code: its command runs a real
small pytest suite with --junitxml; the agent reads the report, stores the attempt's results
document at its key under the job's prefix, and the summary reaches the stage's record and
GET /jobs/{id}. A failure only of quarantined tests ends the stage `warning`, saying so."""

from __future__ import annotations

import hashlib
import json
import shlex
import sys

import pytest

from relevo_agent.messages import Message
from relevo_cli.api import RelevoApi
from relevo_core.aws import client
from relevo_core.models import job_objects
from relevo_core.models.test_results import ResultsDocument
from relevo_core.store.codec import envelope_of, from_attributes
from tests.helpers.agents import agent_at, handle_received
from tests.helpers.stack import job_items, receive_stage, wait_for_execution

pytestmark = pytest.mark.timeout(240)

SUITE = """
import pytest


def test_passes():
    pass


def test_wobbly():
    assert 1 == 2, "timing"


@pytest.mark.parametrize("value", ["a::b", 'say "hi"'])
def test_odd(value):
    pass
"""


def test_a_stage_reads_its_pytest_report_stores_it_and_reports_its_counts(local_stack, project_id, tmp_path):
    # Given a project whose test stage runs a real pytest suite with --junitxml, one test quarantined
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_app.py").write_text(SUITE)
    run = (
        f"cp -r {shlex.quote(str(suite))}/. . && {shlex.quote(sys.executable)} -m pytest -q "
        "-p no:cacheprovider -p no:randomly --junitxml=results/junit.xml test_app.py"
    )
    api = RelevoApi.for_stack(local_stack)
    api.put_project(
        project_id,
        {
            "repo": f"acme/{project_id}",
            "region_affinity": "eu-west",
            "lease_ttl_sec": 30,
            "queue_timeout_sec": 60,
            "stages": [
                {
                    "name": "test",
                    "run": run,
                    "tests": {
                        "junit": ["results/**/*.xml"],
                        "quarantine": [{"id": "test_app::test_wobbly", "by": "ana", "since": "2026-11-30"}],
                    },
                }
            ],
        },
    )

    # When an agent runs it
    job_id = api.run_project(project_id, {"ref": "main"})["job_id"]
    mac = agent_at(tmp_path, local_stack, "mac-t")
    task, receipt = receive_stage(local_stack, job_id, timeout=30)
    handle_received(
        mac, Message(mac.queue_url, {"Body": json.dumps(task), "ReceiptHandle": receipt, "MessageId": "m"})
    )

    # Then the job went on: the stage failed only because of its quarantined test, so it is a warning
    assert wait_for_execution(local_stack, job_id)["status"] == "SUCCEEDED"
    job = api.get_job(job_id)
    stage = job["stages"][0]
    assert stage["status"] == "warning"
    assert "failed only because of quarantined tests (test_app::test_wobbly)" in stage["warning"]
    # and the job view shows its tests counted
    tests = stage["tests"]
    assert (tests["total"], tests["passed"], tests["failed"], tests["quarantined"]) == (4, 3, 1, 1)
    assert tests["reports"] == 1 and tests["warnings"] == []
    # and the document is in S3 at its key, its bytes those the summary names
    items = [from_attributes(item) for item in job_items(local_stack, job_id)]
    record = next(item for item in items if item["sk"].startswith("STAGE#"))
    assert record["tests"]["sha256"] == tests["sha256"]  # on the stage's record, as the outcome wrote it
    uri = next(
        item.get("artifact_uri") or envelope_of(item).get("artifact_uri")
        for item in items
        if item.get("artifact_uri") or envelope_of(item).get("artifact_uri")
    )
    home = job_objects.JobPrefix.of(uri)
    key = job_objects.test_results_key(home, "test", None, 1)
    assert tests["results_key"] == key
    body = client("s3").get_object(Bucket=home.bucket, Key=key)["Body"].read()
    assert hashlib.sha256(body).hexdigest() == tests["sha256"]
    document = ResultsDocument.model_validate_json(body)
    ids = {test.id for test in document.tests}
    assert {"test_app::test_odd[a::b]", 'test_app::test_odd[say "hi"]'} <= ids
    wobbly = next(test for test in document.tests if test.id == "test_app::test_wobbly")
    assert wobbly.quarantined and wobbly.status == "failed" and "timing" in (wobbly.message or "")
