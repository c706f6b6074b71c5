"""python -m relevo_tools.job_machine [--check] [PATH ...]: write the job state machines from the
builder, or with --check exit 1 when a file differs from what the builder makes. Each file is made
by the definition its name says (machine.DEFINITIONS); by default, both of statemachines/."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from relevo_tools.job_machine.machine import DEFINITIONS, build, render

MACHINES = Path(__file__).resolve().parents[3] / "statemachines"
DEFAULT_PATHS = [MACHINES / name for name in DEFINITIONS]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m relevo_tools.job_machine", description=__doc__)
    parser.add_argument(
        "--check",
        action="store_true",
        help="exit 1 when a PATH differs from the builder's output; write nothing",
    )
    parser.add_argument(
        "paths",
        nargs="*",
        type=Path,
        default=DEFAULT_PATHS,
        help=f"the definitions (default {', '.join(str(p) for p in DEFAULT_PATHS)})",
    )
    args = parser.parse_args(argv)
    differs = False
    for path in args.paths:
        wanted = render(DEFINITIONS.get(path.name, build))
        current = path.read_text() if path.exists() else None
        if current == wanted:
            continue
        if args.check:
            print(
                f"{path} is not what the builder makes: run python -m relevo_tools.job_machine",
                file=sys.stderr,
            )
            differs = True
        else:
            path.write_text(wanted)
            print(f"wrote {path}")
    return 1 if differs else 0


if __name__ == "__main__":
    sys.exit(main())
