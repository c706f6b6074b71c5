"""A finished stage's cache restores, read off the table's stream by the status reporter's
function (relevo_core.notify.table_changes), printed as CacheHitRatio EMF documents with the
job's project as their dimension (the job record gives it: a stage record does not hold it)."""

from __future__ import annotations

from typing import Any

from relevo_core.notify.table_changes import on_table_change
from tests.helpers.stack import emf_documents, metrics_printed


class Reporter:
    """The status reporter as the stream sees it: it reports (nothing here) and reads job records."""

    def __init__(self, jobs: dict[str, dict[str, Any]]) -> None:
        self.jobs = jobs

    def report_change(self, old: Any, new: Any, deadline: float) -> None:
        return None

    def job_record(self, job_id: str) -> dict[str, Any] | None:
        return self.jobs.get(job_id)


def test_a_finished_stage_prints_each_cache_restore_as_its_projects_cache_hit_ratio(monkeypatch, capsys):
    # Given the job's record names its project, and its stage restored one cache and missed one
    metrics_printed(monkeypatch)
    reporter = Reporter({"j1": {"pk": "JOB#j1", "sk": "JOB", "project": "ios-app"}})
    running = {"pk": "STAGES#j1", "sk": "STAGE#00", "status": "running", "attempt": 1}
    done = {**running, "status": "succeeded", "caches": [{"restore": "hit"}, {"restore": "miss"}]}
    capsys.readouterr()

    # When the stage's finish comes through the stream
    on_table_change(reporter, running, done, 0.0)  # type: ignore[arg-type]  # a stand-in reporter, not the Reporter class

    # Then two documents say CacheHitRatio 100 and 0, in percent, each of the project ios-app
    documents = [d for d in emf_documents(capsys.readouterr().out) if "CacheHitRatio" in d]
    assert [d["CacheHitRatio"] for d in documents] == [[100.0], [0.0]]
    for document in documents:
        [directive] = document["_aws"]["CloudWatchMetrics"]
        assert directive["Metrics"] == [{"Name": "CacheHitRatio", "Unit": "Percent"}]
        assert set(directive["Dimensions"][0]) == {"Project", "service"} and document["Project"] == "ios-app"
