#!/usr/bin/env python3
"""A recorded double of `xcrun stapler` for Linux hosts (the notarization kind's `stapler`).
Installed into a test's directory as `stapler` (see `install`); its state is beside it in
`stapler-state/`:

- `calls.jsonl`: one line per run, its argv (`staple <file>` or `validate <file>`);
- `stapled/`: the sha256 of each path stapled: `validate` of such a path exits 0, as the real tool's
  does for a file that carries its ticket, 65 otherwise;
- `fail`: while it exists, `staple` fails (exit 65) as the real tool does when Apple's ticket
  cannot be fetched.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
STATE = HERE / "stapler-state"


def install(directory: Path) -> Path:
    """This double as `<directory>/stapler`, executable, with a fresh state; returns its path."""
    directory.mkdir(parents=True, exist_ok=True)
    tool = directory / "stapler"
    tool.write_text(f"#!{sys.executable}\n" + Path(__file__).read_text().split("\n", 1)[1])
    tool.chmod(0o755)
    shutil.rmtree(directory / "stapler-state", ignore_errors=True)
    return tool


def calls(tool: Path) -> list[list[str]]:
    path = tool.parent / "stapler-state" / "calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def fail_staple(tool: Path) -> None:
    state = tool.parent / "stapler-state"
    state.mkdir(parents=True, exist_ok=True)
    (state / "fail").write_text("staple")


def _mark(path: str) -> Path:
    return STATE / "stapled" / hashlib.sha256(str(Path(path).resolve()).encode()).hexdigest()


def main(argv: list[str]) -> int:
    STATE.mkdir(exist_ok=True)
    with (STATE / "calls.jsonl").open("a") as log:
        log.write(json.dumps(argv) + "\n")
    if len(argv) != 2 or argv[0] not in ("staple", "validate"):
        print("Usage: stapler staple|validate <path>", file=sys.stderr)
        return 64
    action, path = argv
    if not Path(path).exists():
        print(f"{path} does not exist.", file=sys.stderr)
        return 66
    if action == "validate":
        if _mark(path).exists():
            print(f"Processing: {path}\nThe validate action worked!")
            return 0
        print(f"Processing: {path}\n{Path(path).name} does not have a ticket stapled to it.")
        return 65
    if (STATE / "fail").exists():
        print(
            f"Processing: {path}\nCloudKit query for {Path(path).name} failed.\n"
            "The staple and validate action failed! Error 65."
        )
        return 65
    _mark(path).parent.mkdir(exist_ok=True)
    _mark(path).touch()
    print(f"Processing: {path}\nThe staple and validate action worked!")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
