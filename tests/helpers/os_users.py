"""OS users for the tests of `run_as` (relevo_agent.build_user): a user of its own made with
useradd (a home, a group of its own) and removed with its home at the end; and directories every
user may search, which pytest's tmp_path is not (its root is its owner's alone). Only root can
make a user; CI runs as root."""

from __future__ import annotations

import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from relevo_agent.build_user import BuildUser


@contextmanager
def os_user(prefix: str = "relevo-build") -> Iterator[BuildUser]:
    name = f"{prefix}-{secrets.token_hex(3)}"
    subprocess.run(
        ["useradd", "--create-home", "--user-group", "--shell", "/bin/bash", name],
        check=True,
        capture_output=True,
    )
    try:
        yield BuildUser.named(name)
    finally:
        subprocess.run(["userdel", "--remove", "--force", name], check=False, capture_output=True)


@contextmanager
def searchable_directory() -> Iterator[Path]:
    """A new directory under /tmp, mode 0755: what is in it is guarded by its own modes only."""
    path = Path(tempfile.mkdtemp(prefix="relevo-runas-", dir="/tmp")).resolve()
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
