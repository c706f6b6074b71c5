"""`make bench`'s summary table (bench/summary.py): each reported figure beside its target and the
round's baseline, a broken or silent bench as a row of its own, a non-zero exit on any miss, and
the README's latest-figures section rewritten with the commit measured."""

from __future__ import annotations

import json
from pathlib import Path

from bench import harness, summary


def _figures(path: Path, *lines: dict) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


def test_a_bench_reports_into_the_file_make_bench_names_and_nowhere_without_it(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.delenv(harness.SUMMARY_FILE_ENV, raising=False)
    harness.report("agent", "idle agent RSS", 51.3, "51.3 MB", "<= 55 MB", True)  # run by hand: printed only
    target = tmp_path / "figures.jsonl"
    monkeypatch.setenv(harness.SUMMARY_FILE_ENV, str(target))
    harness.report("agent", "idle agent RSS", 51.3, "51.3 MB", "<= 55 MB", True)
    harness.report("agent", "log shipping", 4.8, "4.8 MB/s", ">= 25 MB/s", False)
    assert [json.loads(line)["figure"] for line in target.read_text().splitlines()] == [
        "idle agent RSS",
        "log shipping",
    ]


def test_every_figure_sits_beside_its_target_and_baseline_and_a_miss_fails_the_run(
    tmp_path: Path, capsys
) -> None:
    figures = _figures(
        tmp_path / "f.jsonl",
        {
            "bench": "agent",
            "figure": "idle agent RSS",
            "value": 51.3,
            "shown": "51.3 MB",
            "target": "<= 55 MB",
            "ok": True,
        },
        {
            "bench": "agent",
            "figure": "log shipping",
            "value": 4.8,
            "shown": "4.8 MB/s",
            "target": ">= 25 MB/s",
            "ok": False,
        },
        {"bench": "agent", "exit": 1},
    )
    assert summary.main([str(figures)]) == 1
    out = capsys.readouterr().out
    rss = next(line for line in out.splitlines() if "idle agent RSS" in line)
    assert [cell.strip() for cell in rss.strip("|").split("|")] == [
        "agent",
        "idle agent RSS",
        "51.3 MB",
        "<= 55 MB",
        "61.2 MB",
        "ok",
    ]
    assert "MISSED" in next(line for line in out.splitlines() if "| log shipping " in line)
    assert "1 of 2 met; missed: agent/log shipping" in out


def test_a_broken_bench_and_a_bench_that_reported_nothing_are_misses_of_their_own(
    tmp_path: Path, capsys
) -> None:
    figures = _figures(
        tmp_path / "f.jsonl",
        {
            "bench": "cost",
            "figure": "$ per 1,000 4-stage jobs",
            "value": 0.45,
            "shown": "$0.450",
            "target": "<= $0.50",
            "ok": True,
        },
        {"bench": "cost", "exit": 0},
        {"bench": "handoff", "exit": 2},
        {"bench": "console", "exit": 0},
    )
    assert summary.main([str(figures)]) == 1
    out = capsys.readouterr().out
    assert "| handoff " in out and "exit 2" in out
    assert "| console " in out and "exit 0" in out  # ran, but no figure reached the summary
    assert "$0.588" in out  # the round's baseline beside the cost


def test_all_met_exits_zero_and_the_readme_section_is_replaced_with_the_commit(
    tmp_path: Path, capsys
) -> None:
    figures = _figures(
        tmp_path / "f.jsonl",
        {
            "bench": "intake",
            "figure": "AWS calls: duplicate",
            "value": 1.0,
            "shown": "1.00",
            "target": "<= 1",
            "ok": True,
        },
        {"bench": "intake", "exit": 0},
    )
    readme = tmp_path / "README.md"
    readme.write_text(
        f"# Benchmarks\n\n{summary.BEGIN}\nold table\n{summary.END}\n\nthe rest\n", encoding="utf-8"
    )
    assert summary.main([str(figures), "--readme", str(readme)]) == 0
    text = readme.read_text(encoding="utf-8")
    assert "old table" not in text and text.endswith("\n\nthe rest\n")
    assert "`make bench` at " in text and "(round start: 4a6be69)" in text
    assert "| intake | AWS calls: duplicate | 1.00 " in text
