"""$RELEVO_OUTPUT's syntax as the agent reads it while the command runs (relevo_agent.outputs):
key=value lines and heredocs, fed in pieces as a command writes them; the limits; masked values
withheld; the variable names later stages get."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from relevo_agent.outputs import OutputInvalid, OutputParser, OutputWatch
from relevo_agent.prepare import PrepareFailure, output_variables
from relevo_core.jobs.handoff_sources import EarlierStage
from relevo_core.models.errors import ErrorClass
from relevo_core.models.handoff import (
    MAX_HANDED_ON_OUTPUT_BYTES,
    MAX_OUTPUT_BYTES,
    MAX_OUTPUT_KEYS,
    output_variable,
    previous_output_variable,
)


def _parse(text: str) -> dict[str, str]:
    parser = OutputParser()
    parser.feed(text.encode())
    parser.finish()
    return parser.values


def test_key_value_lines_and_heredocs() -> None:
    assert _parse(
        "version=1.4.2\nnotes<<EOF\nfirst line\n\nsecond=line\nEOF\nempty=\nurl=https://x/?a=b\n"
    ) == {
        "version": "1.4.2",
        "notes": "first line\n\nsecond=line",
        "empty": "",
        "url": "https://x/?a=b",
    }


def test_the_last_value_of_a_key_wins_and_blank_lines_are_ignored() -> None:
    assert _parse("v=1\n\n  \nv=2\n") == {"v": "2"}


def test_crlf_line_ends_are_taken_as_newlines() -> None:
    assert _parse("a=1\r\nb<<E\r\nx\r\nE\r\n") == {"a": "1", "b": "x"}


def test_a_value_is_complete_only_at_its_newline_and_a_heredoc_at_its_delimiter() -> None:
    parser = OutputParser()
    assert parser.feed(b"submission_id=abc") == []
    assert parser.feed(b"123\nnotes<<END\nline") == ["submission_id"]
    assert parser.values == {"submission_id": "abc123"}
    assert parser.feed(b" one\nEN") == []
    assert parser.feed(b"D\n") == ["notes"]
    assert parser.values["notes"] == "line one"


def test_a_last_line_without_its_newline_counts_when_the_command_ends() -> None:
    parser = OutputParser()
    parser.feed(b"a=1\nb=2")
    assert parser.finish() == ["b"] and parser.values == {"a": "1", "b": "2"}


@pytest.mark.parametrize(
    "text, says",
    [
        ("just words\n", "line 1: 'just words' is neither key=value nor key<<DELIMITER"),
        ("ok=1\n9lives=x\n", "line 2: '9lives' is not an output name"),
        ("notes<<EOF\nnever closed\n", "line 1: the value of 'notes' (<<EOF) never ends"),
        ("bad key=1\n", "is not an output name"),
    ],
)
def test_what_is_neither_form_fails_naming_the_line(text: str, says: str) -> None:
    with pytest.raises(OutputInvalid) as invalid:
        _parse(text)
    assert says in str(invalid.value)


def test_a_value_holding_a_masked_secret_is_withheld() -> None:
    parser = OutputParser(secrets=["s3cr3t-token"])
    parser.feed(b"token=Bearer s3cr3t-token\nversion=1\n")
    assert parser.values == {"version": "1"} and parser.withheld == ["token"]


def test_the_limits_fail_the_stage_with_the_number() -> None:
    with pytest.raises(OutputInvalid) as too_many:
        _parse("".join(f"k{i}=v\n" for i in range(MAX_OUTPUT_KEYS + 1)))
    assert f"at most {MAX_OUTPUT_KEYS}" in str(too_many.value)
    with pytest.raises(OutputInvalid) as too_big:
        _parse("blob=" + "x" * MAX_OUTPUT_BYTES + "\n")
    assert f"at most {MAX_OUTPUT_BYTES}" in str(too_big.value)
    # Exactly at the limit is fine.
    assert len(_parse("b=" + "x" * (MAX_OUTPUT_BYTES - 1) + "\n")["b"]) == MAX_OUTPUT_BYTES - 1


def test_later_stages_get_each_value_as_relevo_out_stage_key() -> None:
    assert output_variable("build", "version") == "RELEVO_OUT_BUILD_VERSION"
    assert output_variable("app-store", "build-number") == "RELEVO_OUT_APP_STORE_BUILD_NUMBER"
    assert previous_output_variable("submission-id") == "RELEVO_PREVIOUS_OUT_SUBMISSION_ID"
    earlier = [
        EarlierStage("build", "job_x", "a", None, {"version": "1"}),
        EarlierStage("sign", "job_x", "b", None, {"id": "7"}),
    ]
    assert output_variables(earlier) == {"RELEVO_OUT_BUILD_VERSION": "1", "RELEVO_OUT_SIGN_ID": "7"}


def test_two_values_that_would_be_one_variable_fail_the_later_stage() -> None:
    earlier = [
        EarlierStage("a-b", "job_x", "a", None, {"c": "1"}),
        EarlierStage("a", "job_x", "b", None, {"b_c": "2"}),
    ]
    with pytest.raises(PrepareFailure) as clash:
        output_variables(earlier)
    assert "a-b.c and a.b_c would both be RELEVO_OUT_A_B_C" in clash.value.message


def test_each_shards_values_reach_later_stages_under_its_index() -> None:
    earlier = [
        EarlierStage("build", "job_x", "a", None, {"version": "1"}),
        *(
            EarlierStage("ui-test", "job_x", f"mac-{k}", None, {"passed": str(10 + k)}, shard=k)
            for k in range(3)
        ),
    ]

    assert output_variables(earlier) == {
        "RELEVO_OUT_BUILD_VERSION": "1",
        "RELEVO_OUT_UI_TEST_SHARD0_PASSED": "10",
        "RELEVO_OUT_UI_TEST_SHARD1_PASSED": "11",
        "RELEVO_OUT_UI_TEST_SHARD2_PASSED": "12",
    }


def test_a_shards_value_and_another_stages_that_would_be_one_variable_fail_naming_the_shard() -> None:
    earlier = [
        EarlierStage("test", "job_x", "a", None, {"x": "1"}, shard=1),
        EarlierStage("test", "job_x", "b", None, {"shard1_x": "2"}),
    ]
    with pytest.raises(PrepareFailure) as clash:
        output_variables(earlier)
    assert "test#shard-1.x and test.shard1_x would both be RELEVO_OUT_TEST_SHARD1_X" in clash.value.message


def test_values_handed_on_past_half_of_kern_argmax_fail_the_stage_naming_the_largest() -> None:
    """45 stage runs of 16 KiB each would be 720 KiB of environment: a stage is handed at most 512 KiB."""
    full = {f"k{n}": "x" * (MAX_OUTPUT_BYTES // 4 - 8) for n in range(4)}
    within = [
        EarlierStage("test", "job_x", "a", None, full, shard=k)
        for k in range(MAX_HANDED_ON_OUTPUT_BYTES // MAX_OUTPUT_BYTES - 1)
    ]
    assert len(output_variables(within)) == 4 * len(within)

    over = [EarlierStage("test", "job_x", "a", None, full, shard=k) for k in range(45)]
    with pytest.raises(PrepareFailure) as refused:
        output_variables(over)
    assert refused.value.error_class is ErrorClass.OUTPUT_INVALID
    assert f"over the {MAX_HANDED_ON_OUTPUT_BYTES} a stage is handed" in refused.value.message
    assert "the largest: test#shard-0 " in refused.value.message


def test_the_watch_hands_each_value_on_while_the_command_still_runs(tmp_path: Path) -> None:
    seen: list[dict[str, str]] = []
    watch = OutputWatch.create(
        tmp_path / "outputs" / "job.stage.1", [], lambda values, changed: seen.append(values)
    )
    watch.interval_sec = 0.02
    watch.start()
    with open(watch.path, "a") as handle:
        handle.write("submission_id=sub-1\n")
        handle.flush()
        deadline = time.monotonic() + 5
        while not seen and time.monotonic() < deadline:
            threading.Event().wait(0.02)
        assert seen == [{"submission_id": "sub-1"}]  # before the command has ended
        handle.write("status=accepted")
    assert watch.stop() == {"submission_id": "sub-1", "status": "accepted"}
    assert oct(watch.path.stat().st_mode & 0o777) == "0o600"
