"""The credentials of a checkout (`credentials_ref`, Secrets Manager) as the git processes that talk
to the remote get them: an askpass helper (https) or an identity file (ssh) in a private
temporary directory, removed after each command. Never the stage's environment, its log, the
workspace or any .git/config.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from relevo_agent.build_user import BuildUser
from relevo_agent.git_commands import CheckoutFailure
from relevo_core.aws import client
from relevo_core.models.errors import ErrorClass


def git_secret(credentials_ref: str) -> dict[str, Any]:
    """The secret of `credentials_ref`: a JSON object of its fields, or a bare password or token."""
    try:
        answer = client("secretsmanager").get_secret_value(SecretId=credentials_ref)
    except Exception as exc:  # noqa: BLE001 - the stage fails saying why, never with the secret
        code = getattr(exc, "response", {}).get("Error", {}).get("Code", type(exc).__name__)
        retryable = code in ("InternalServiceError", "ThrottlingException") or not hasattr(exc, "response")
        raise CheckoutFailure(
            ErrorClass.CONNECTION_RESET if retryable else ErrorClass.CHECKOUT_FAILED,
            f"checkout: the credentials {credentials_ref} could not be read ({code})",
        ) from None
    text = answer.get("SecretString") or ""
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    return parsed if isinstance(parsed, dict) else {"password": text.strip()}


@contextmanager
def credential_files(
    secret: dict[str, Any], owner: BuildUser | None = None, parent: Path | None = None
) -> Iterator[tuple[dict[str, str], list[str]]]:
    """(environment for the git processes that talk to the remote, secret values to mask): the
    files git needs for `secret` in a private directory (under `parent`), removed after. With
    `owner`: that user's once written, for the git it runs (a copy of its own: the agent's git
    never runs a file the build user could have rewritten)."""
    directory = Path(tempfile.mkdtemp(prefix="relevo-git-", dir=parent))  # 0700, this user's only
    try:
        env: dict[str, str] = {}
        masked: list[str] = []
        if secret.get("ssh_private_key"):
            key = directory / "identity"
            _private_file(key, str(secret["ssh_private_key"]).rstrip("\n") + "\n")
            options = [
                "-i",
                str(key),
                "-o",
                "IdentitiesOnly=yes",
                "-o",
                "BatchMode=yes",
                "-o",
                "StrictHostKeyChecking=yes",
            ]
            if secret.get("known_hosts"):
                known = directory / "known_hosts"
                _private_file(known, str(secret["known_hosts"]))
                options += ["-o", f"UserKnownHostsFile={known}"]
            env["GIT_SSH_COMMAND"] = " ".join(["ssh", *(_quote(option) for option in options)])
            masked.append(str(secret["ssh_private_key"]))
        else:
            password = str(secret.get("password") or secret.get("token") or "")
            username = str(secret.get("username") or "x-access-token")
            _private_file(directory / "username", username)
            _private_file(directory / "password", password)
            askpass = directory / "askpass"
            askpass.write_text(
                '#!/bin/sh\ncase "$1" in\n  Username*) cat "$(dirname "$0")/username" ;;\n  *) cat '
                '"$(dirname "$0")/password" ;;\nesac\n'
            )
            askpass.chmod(0o700)
            env["GIT_ASKPASS"] = str(askpass)
            masked.append(password)
        if owner is not None:
            owner.hand_over(directory)
        yield env, [value for value in masked if value]
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _private_file(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)


def _quote(value: str) -> str:
    return "'" + value.replace("'", "'\\''") + "'"
