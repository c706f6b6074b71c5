"""python -m relevo_tools.job_machine [--check] [PATH]: write the job state machine from the
builder, or with --check exit 1 when the file differs from what the builder makes."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from relevo_tools.job_machine.machine import render

DEFAULT_PATH = Path(__file__).resolve().parents[3] / "statemachines" / "job.asl.json"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m relevo_tools.job_machine", description=__doc__)
    parser.add_argument(
        "--check",
        action="store_true",
        help="exit 1 when PATH differs from the builder's output; write nothing",
    )
    parser.add_argument(
        "path", nargs="?", type=Path, default=DEFAULT_PATH, help=f"the definition (default {DEFAULT_PATH})"
    )
    args = parser.parse_args(argv)
    wanted = render()
    current = args.path.read_text() if args.path.exists() else None
    if args.check:
        if current != wanted:
            print(
                f"{args.path} is not what the builder makes: run python -m relevo_tools.job_machine",
                file=sys.stderr,
            )
            return 1
        return 0
    if current != wanted:
        args.path.write_text(wanted)
        print(f"wrote {args.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
