"""The table `make bench` ends with: every figure the benches reported (bench/harness.py report),
beside its target and the round's baseline (bench/baselines.json); each bench that broke or
reported nothing is a row too. Exits 1 when any target is missed or any bench failed.

    python bench/summary.py FIGURES.jsonl [--readme bench/README.md]

With --readme, the table and the commit it was measured at replace the README's "Latest figures"
section (between its two markers), so the README keeps the latest run's figures.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASELINES = Path(__file__).with_name("baselines.json")
BEGIN, END = "<!-- latest figures: written by bench/summary.py -->", "<!-- end of latest figures -->"


@dataclass(frozen=True)
class Row:
    bench: str
    figure: str
    shown: str
    target: str
    baseline: str
    ok: bool


def read_rows(figures_file: Path, baselines: dict[str, str]) -> list[Row]:
    """The figures in the order reported, then a row for each bench that exited with 2 (broken)
    or reported no figure at all (the Makefile appends {"bench", "exit"} per bench)."""
    rows: list[Row] = []
    exits: dict[str, int] = {}
    for number, line in enumerate(figures_file.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise SystemExit(f"{figures_file}:{number}: not JSON ({exc.msg})") from None
        if "exit" in item:
            exits[item["bench"]] = int(item["exit"])
            continue
        key = f"{item['bench']}/{item['figure']}"
        rows.append(
            Row(
                item["bench"],
                item["figure"],
                item["shown"],
                item["target"],
                baselines.get(key, "-"),
                bool(item["ok"]),
            )
        )
    reported = {row.bench for row in rows}
    for bench, code in exits.items():
        if code == 2 or bench not in reported:
            rows.append(Row(bench, "the bench itself", f"exit {code}", "runs to the end", "-", False))
    return rows


def table(rows: list[Row]) -> list[str]:
    """A Markdown table: readable on a terminal, and the README's section as it is."""
    header = ("bench", "figure", "now", "target", "round start", "")
    cells = [header] + [
        (r.bench, r.figure, r.shown, r.target, r.baseline, "ok" if r.ok else "MISSED") for r in rows
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]

    def line(row: tuple[str, ...]) -> str:
        return "| " + " | ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)) + " |"

    return [line(header), "|" + "|".join("-" * (width + 2) for width in widths) + "|"] + [
        line(row) for row in cells[1:]
    ]


def measured_at() -> str:
    """The commit the run measured, marked when the work tree had changes beside it."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, check=False
        ).stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    return commit + (" with uncommitted changes" if dirty else "")


def write_readme(readme: Path, lines: list[str], commit: str, baseline_commit: str) -> None:
    text = readme.read_text(encoding="utf-8")
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{readme}: no '{BEGIN}' ... '{END}' section to write the figures into")
    day = datetime.now(UTC).strftime("%Y-%m-%d")
    section = "\n".join(
        [BEGIN, "", f"`make bench` at {commit}, {day} (round start: {baseline_commit}):", "", *lines, "", END]
    )
    head, rest = text.split(BEGIN, 1)
    readme.write_text(head + section + rest.split(END, 1)[1], encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("figures", type=Path, help="the JSON Lines file the benches reported into")
    parser.add_argument(
        "--readme", type=Path, help="write the table into this README's latest-figures section"
    )
    args = parser.parse_args(argv)
    baselines = json.loads(BASELINES.read_text(encoding="utf-8"))
    rows = read_rows(args.figures, baselines["figures"])
    lines = table(rows)
    missed = [row for row in rows if not row.ok]
    print()
    print("== summary")
    print("\n".join(lines))
    print(
        f"{len(rows) - len(missed)} of {len(rows)} met"
        + (f"; missed: {', '.join(f'{r.bench}/{r.figure}' for r in missed)}" if missed else "")
    )
    if args.readme is not None:
        write_readme(args.readme, lines, measured_at(), baselines["commit"])
    return 1 if missed or not rows else 0


if __name__ == "__main__":
    sys.exit(main())
