"""What makes a stage end `warning` on the agent: lines marked `::warning::` however the output is
cut into reads, and exit codes the stage declares warnings; the output reaches the log unchanged."""

from __future__ import annotations

from relevo_agent.warning_lines import KEPT, WarningLines, ended_well, warning_summary
from relevo_core.models.plan import StagePlan

PLAN = StagePlan(name="lint", command="swiftlint", warning_exit_codes=(3,))


def test_marked_lines_are_counted_across_reads_and_passed_on_unchanged():
    written: list[bytes] = []
    lines = WarningLines(written.append)
    for piece in (
        b"compiling\n::warn",
        b"ing file=A.swift,line=3::deprecated API\nok\n",
        b"::warning::no newline at the end",
    ):
        lines.write(piece)
    summary = warning_summary(PLAN, 0, lines)

    assert (
        b"".join(written)
        == b"compiling\n::warning file=A.swift,line=3::deprecated API\nok\n::warning::no newline at the end"
    )
    assert summary == {
        "exit_code": None,
        "lines": 2,
        "first": ["deprecated API", "no newline at the end"],
        "text": "2 lines marked ::warning::, first: deprecated API",
    }


def test_only_lines_that_start_with_the_marker_count_and_the_first_few_are_kept():
    lines = WarningLines(lambda data: None)
    lines.write(b"echo ::warning::in the middle\n  ::warning::indented\n::error::not a warning\n")
    lines.write(b"".join(b"::warning::w%d\n" % n for n in range(KEPT + 3)))
    summary = warning_summary(PLAN, 0, lines)
    assert summary["lines"] == KEPT + 3 and summary["first"] == [f"w{n}" for n in range(KEPT)]


def test_a_warning_exit_code_ends_well_and_any_other_does_not():
    assert ended_well(PLAN, 0) and ended_well(PLAN, 3) and not ended_well(PLAN, 1)
    assert (
        warning_summary(PLAN, 3, WarningLines(lambda data: None))["text"]
        == "exit 3 (one of its warning_exit_codes)"
    )
    assert warning_summary(PLAN, 0, WarningLines(lambda data: None)) is None  # a plain success
