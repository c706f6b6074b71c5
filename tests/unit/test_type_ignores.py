"""Every `type: ignore` in the repository names the error it allows and says why, on its own line:
`# type: ignore[code]  # why`. mypy (`make lint`) refuses one without a code (ignore-without-code)
and one that allows nothing (warn_unused_ignores); the reason is this test's to ask for."""

from __future__ import annotations

import io
import re
import subprocess
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The one accepted form: codes in brackets, then a comment of its own with at least a word.
JUSTIFIED = re.compile(r"type:\s*ignore\[[a-z0-9-]+(?:,\s*[a-z0-9-]+)*\]\s+#\s*\w")


def _python_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return [ROOT / name for name in listed if (ROOT / name).is_file()]


def unjustified_ignores(source: str) -> list[tuple[int, str]]:
    """(line, comment) of each `type: ignore` comment without a code or without a reason."""
    found = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type != tokenize.COMMENT or not re.search(r"type:\s*ignore", token.string):
            continue
        if not JUSTIFIED.search(token.string):
            found.append((token.start[0], token.string))
    return found


def test_the_check_tells_a_justified_ignore_from_the_others():
    # Given one ignore of each kind, and the words in a string, which are no comment
    source = (
        "a = f()  # type: ignore\n"
        "b = f()  # type: ignore[attr-defined]\n"
        "c = f()  # type: ignore[attr-defined]  #\n"
        "d = f()  # type: ignore[attr-defined, union-attr]  # moto's internals\n"
        "e = '# type: ignore'\n"
    )
    # When it is checked, Then the first three are refused and the rest pass
    assert [line for line, _ in unjustified_ignores(source)] == [1, 2, 3]


def test_every_type_ignore_in_the_repository_has_a_code_and_a_reason():
    # Given every Python file of the repository (tests and benches too)
    files = _python_files()
    assert any(path.name == "aws.py" for path in files)
    # When their comments are read
    missing = [
        f"{path.relative_to(ROOT)}:{line}: {comment}"
        for path in files
        for line, comment in unjustified_ignores(path.read_text())
    ]
    # Then each ignore says what it allows and why
    assert missing == [], "\n".join(missing)
