#!/usr/bin/env python3
"""A recorded double of macOS's /usr/bin/security for the commands of a signing keychain
(relevo_agent.keychain), for Linux hosts. Copied into a test's directory as `security` (see
`install`); it keeps its state in `security-state/` beside itself:

- `calls.jsonl`: one line per run: its argv, whether stdin carried anything, and for `-i` the
  commands read from stdin, each split as SecurityTool splits a line, with the values of -p, -k and
  -P replaced by `<secret N>` (N: the order in which distinct values were first seen; only their
  sha256 is kept) so a test can pin the sequence and see which commands shared a password;
- `search-list`: the user's keychain search list (at first the login and System keychains, as
  `list-keychains -d user` prints them: fixtures/security);
- `keychains/`: per keychain made, its password's sha256 and whether it is unlocked;
- `fail`: a command name; while it exists, that command fails as the real tool does.

It answers like the real tool: the recorded outputs of fixtures/security, nothing for commands
that print nothing, `security: <function> <path>: <message>` on stderr and a non-zero exit for a
wrong password, a missing keychain, a keychain that exists already, a locked keychain.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
STATE = HERE / "security-state"
# The recorded outputs, copied beside the installed double (`install`).
FIXTURES = HERE / "security-fixtures"
RECORDED = Path(__file__).resolve().parents[1] / "unit" / "fixtures" / "security"
SECRET_FLAGS = {
    "create-keychain": "-p",
    "unlock-keychain": "-p",
    "set-key-partition-list": "-k",
    "import": "-P",
}


def install(directory: Path) -> Path:
    """This double as `<directory>/security`, executable, with a fresh state and the recorded
    outputs beside it; returns its path (an agent config's security_tool)."""
    directory.mkdir(parents=True, exist_ok=True)
    tool = directory / "security"
    tool.write_text(f"#!{sys.executable}\n" + Path(__file__).read_text().split("\n", 1)[1])
    tool.chmod(0o755)
    shutil.rmtree(directory / "security-state", ignore_errors=True)
    shutil.copytree(RECORDED, directory / "security-fixtures", dirs_exist_ok=True)
    return tool


def calls(tool: Path) -> list[dict]:
    path = tool.parent / "security-state" / "calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def commands(tool: Path) -> list[list[str]]:
    """Every command the double ran, in order: argv commands as given, interactive ones as split."""
    found = []
    for call in calls(tool):
        found.extend(call["lines"] if call["argv"][:1] == ["-i"] else [call["argv"]])
    return found


def search_list(tool: Path) -> list[str]:
    path = tool.parent / "security-state" / "search-list"
    return json.loads(path.read_text()) if path.exists() else _initial_list()


def _initial_list() -> list[str]:
    return [
        line.strip().strip('"')
        for line in ((FIXTURES if FIXTURES.is_dir() else RECORDED) / "list-keychains-d-user.txt")
        .read_text()
        .splitlines()
        if line.strip()
    ]


class Failed(Exception):
    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def _secret_label(value: str) -> str:
    known_path = STATE / "secrets.json"
    known = json.loads(known_path.read_text()) if known_path.exists() else []
    digest = _digest(value)
    if digest not in known:
        known.append(digest)
        known_path.write_text(json.dumps(known))
    return f"<secret {known.index(digest) + 1}>"


def _redacted(argv: list[str]) -> list[str]:
    flag = SECRET_FLAGS.get(argv[0]) if argv else None
    out = list(argv)
    for index, argument in enumerate(argv[:-1]):
        if flag and argument == flag:
            out[index + 1] = _secret_label(argv[index + 1])
    return out


def _option(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv[:-1] else None


def _keychain_state(path: str) -> Path:
    return STATE / "keychains" / (_digest(str(Path(path).resolve())) + ".json")


def _load_keychain(path: str, function: str) -> dict:
    state = _keychain_state(path)
    if not state.exists() or not Path(path).exists():
        raise Failed(f"security: {function} {path}: The specified keychain could not be found.", 50)
    return json.loads(state.read_text())


def _write_list(paths: list[str]) -> None:
    (STATE / "search-list").write_text(json.dumps(paths))


def _run(argv: list[str]) -> str:
    if not argv:
        raise Failed("usage: security [-h] [-i] [-l] [-p prompt] [-q] [-v] [command] [opt ...]", 2)
    command, rest = argv[0], argv[1:]
    fail = STATE / "fail"
    if fail.exists() and fail.read_text().strip() == command:
        raise Failed(f"security: {command}: The operation couldn't be completed. (injected failure)", 1)
    if command == "create-keychain":
        path, password = rest[-1], _option(rest, "-p")
        if password is None:
            raise Failed("security: create-keychain: no password given and no terminal to prompt on", 1)
        if Path(path).exists():
            raise Failed(
                f"security: SecKeychainCreate {path}: A keychain with the same name already exists.", 48
            )
        Path(path).write_bytes(b"kych")
        _keychain_state(path).write_text(
            json.dumps({"password": _digest(password), "unlocked": True, "identities": 0})
        )
        return ""
    if command == "unlock-keychain":
        path, password = rest[-1], _option(rest, "-p")
        state = _load_keychain(path, "SecKeychainUnlock")
        if password is None or _digest(password) != state["password"]:
            raise Failed(
                f"security: SecKeychainUnlock {path}: The user name or passphrase you entered is not "
                "correct.",
                51,
            )
        state["unlocked"] = True
        _keychain_state(path).write_text(json.dumps(state))
        return ""
    if command == "set-keychain-settings":
        _load_keychain(rest[-1], "SecKeychainSetSettings")
        return ""
    if command == "import":
        source, path = rest[0], _option(rest, "-k")
        if path is None or not Path(source).is_file():
            raise Failed(f"security: SecKeychainItemImport: Unable to read {source}", 1)
        state = _load_keychain(path, "SecKeychainItemImport")
        if not state["unlocked"]:
            raise Failed("security: SecKeychainItemImport: User interaction is not allowed.", 1)
        if _option(rest, "-P") is None:
            raise Failed(
                "security: SecKeychainItemImport: MAC verification failed during PKCS12 import (wrong "
                "password?)",
                1,
            )
        state["identities"] += 1
        _keychain_state(path).write_text(json.dumps(state))
        return (FIXTURES / "import-p12.txt").read_text()
    if command == "set-key-partition-list":
        path, password = rest[-1], _option(rest, "-k")
        state = _load_keychain(path, "SecKeychainItemSetAccessWithPassword")
        if password is None or _digest(password) != state["password"]:
            raise Failed(
                "security: SecKeychainItemSetAccessWithPassword: The user name or passphrase you entered is "
                "not correct.",
                1,
            )
        return (FIXTURES / "set-key-partition-list.txt").read_text().replace("%KEYCHAIN%", path) * state[
            "identities"
        ]
    if command == "list-keychains":
        if "-s" in rest:
            _write_list(rest[rest.index("-s") + 1 :])
            return ""
        return "".join(f'    "{path}"\n' for path in search_list(HERE / "security"))
    if command == "delete-keychain":
        for path in rest:
            _load_keychain(path, "SecKeychainDelete")
            Path(path).unlink()
            _keychain_state(path).unlink()
            _write_list(
                [
                    entry
                    for entry in search_list(HERE / "security")
                    if Path(entry).resolve() != Path(path).resolve()
                ]
            )
        return ""
    raise Failed(f'security: unknown command "{command}"', 2)


def main(argv: list[str]) -> int:
    (STATE / "keychains").mkdir(parents=True, exist_ok=True)
    stdin = "" if sys.stdin is None or sys.stdin.isatty() else sys.stdin.read()
    record = {"argv": argv, "stdin": bool(stdin), "lines": []}
    status = 0
    try:
        if argv[:1] == ["-i"]:
            for line in stdin.splitlines():
                words = shlex.split(line)
                if not words:
                    continue
                record["lines"].append(_redacted(words))
                try:
                    sys.stdout.write(_run(words))
                    status = 0
                except Failed as failed:
                    sys.stderr.write(f"{failed}\n")
                    status = failed.code
        else:  # recorded as given: a secret here is what a test must see
            sys.stdout.write(_run(argv))
    except Failed as failed:
        sys.stderr.write(f"{failed}\n")
        status = failed.code
    with open(STATE / "calls.jsonl", "a") as log:
        log.write(json.dumps(record) + "\n")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
