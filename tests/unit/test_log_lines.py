"""Reading a job's log: the query string of GET /jobs/{id}/logs, and chunks cut into lines for the
tail in the job view (no AWS)."""

from __future__ import annotations

import pytest

from relevo_core.jobs.logs import split_lines
from relevo_core.models.errors import ErrorCode, RelevoError
from relevo_core.models.requests import LogQuery, parse_query
from relevo_core.store.log_chunks import LogChunk


def _chunk(seq: int, data: str, stage: str = "build", attempt: int = 1, agent: str = "mac-a") -> LogChunk:
    return LogChunk(
        job_id="j", seq=seq, stage=stage, attempt=attempt, agent_id=agent, data=data, written_at="t"
    )


def test_lines_span_chunks_of_one_attempt_and_end_with_it():
    chunks = [
        _chunk(0, "one\ntw"),
        _chunk(1, "o\nthr"),
        _chunk(2, "ee\n"),
        _chunk(3, "no newline at the end"),
        _chunk(4, "sign 1\n", stage="sign"),
        _chunk(5, "sign 2", stage="sign", attempt=2, agent="mac-b"),
        _chunk(6, "\n\nlast", stage="sign", attempt=2, agent="mac-b"),
    ]
    lines = [(line["seq"], line["stage"], line["attempt"], line["text"]) for line in split_lines(chunks)]
    assert lines == [
        (0, "build", 1, "one"),
        (0, "build", 1, "two"),
        (1, "build", 1, "three"),
        (3, "build", 1, "no newline at the end"),
        (4, "sign", 1, "sign 1"),
        (5, "sign", 2, "sign 2"),
        (6, "sign", 2, ""),
        (6, "sign", 2, "last"),
    ]


@pytest.mark.parametrize(
    "params",
    [
        {"from_seq": "-1"},
        {"before_seq": "x"},
        {"limit": "0"},
        {"limit": "1001"},
        {"from_seq": "1", "before_seq": "5"},
        {"from_seq": str(10**12)},
        {"since": "yesterday"},
        {"from_seq": "7,1.0:3"},
        {"from_seq": "7,01.00:-3"},
        {"before_seq": "07"},
    ],
)
def test_a_query_string_that_does_not_fit_is_query_invalid(params):
    with pytest.raises(RelevoError) as refused:
        parse_query(LogQuery, params)
    assert refused.value.code == ErrorCode.QUERY_INVALID and refused.value.status == 400


def test_the_query_defaults_to_the_start_of_the_log():
    assert parse_query(LogQuery, None) == LogQuery(from_seq=None, before_seq=None, limit=100)
    assert parse_query(LogQuery, {"before_seq": "7", "limit": "5"}).before_seq == "7"
    # A cursor of a job with shards: its own seq, then each shard's partition past its start.
    assert parse_query(LogQuery, {"from_seq": "7,01.00:3,01.01:12"}).from_seq == "7,01.00:3,01.01:12"
