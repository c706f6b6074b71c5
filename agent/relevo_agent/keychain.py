"""A temporary signing keychain for one stage of a job whose project sets `signing.keychain:
temporary` (issue 20). With `security` (/usr/bin/security on macOS, `security_tool` of the config):

    create-keychain -p PW K ─► set-keychain-settings -lut <the stage's time> K ─► unlock-keychain -p PW K
      ─► import <p12> -k K -f pkcs12 -P PASSPHRASE -T codesign -T security -T productbuild   (each identity)
      ─► set-key-partition-list -S apple-tool:,apple:,codesign: -s -k PW K   (codesign, under launchd with no
         GUI session, may use the keys without a prompt)
      ─► list-keychains -d user -s K <the user's list as it was>
      … the stage runs with RELEVO_KEYCHAIN=K …
    list-keychains -d user -s <the user's list without K> ─► delete-keychain K

Secrets stay out of argv. `-p`/`-k`/`-P` take the password on the command line, where `ps` shows it
to every user of the Mac; without them `security` prompts (a terminal, or SecurityAgent's dialog,
which has no session under launchd). So each command that carries the keychain's password or a
passphrase is one line on the stdin of `security -i`: interactive mode reads its commands from
stdin until EOF, split by its own quoting (double quotes, backslash escapes: Apple's SecurityTool
`split_line`); `ps` shows `security -i` only. The password is 32 random bytes in hex, held in
memory for the keychain's creation, never logged, never in the stage's environment (the stage needs
no password: the keychain is unlocked). A .p12 is written to a 0600 file of the keychain directory
(0700) for `import` to read and removed at once.

The search list is the user's, not the process's: `list-keychains -d user` is shared by every
process of the user, the `dynamic` domain is the system's (smart cards), and `codesign --keychain`
or Xcode's OTHER_CODE_SIGN_FLAGS=--keychain pick the identity but still need the list for the
certificate chain and Xcode's own identity lookup. So the keychain goes on the user's list and a
stage with one runs alone on its agent (relevo_agent.stage: the signing gate): no other stage of
this agent can see it. An agent with `run_as` makes none (`require` says why). A crash leaves a
keychain behind: `sweep`, at the agent's start, takes every keychain of
<workspace_root>/.relevo-keychains off the list and deletes it. A delete that fails is logged and
tried again at the next start; it never fails the job.
"""

from __future__ import annotations

import logging
import os
import platform
import secrets
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from botocore.exceptions import BotoCoreError, ClientError

from relevo_agent.config import AgentConfig
from relevo_core.aws import client, error_code
from relevo_core.models.errors import ErrorClass

if TYPE_CHECKING:
    from relevo_core.models.plan import SigningPlan

log = logging.getLogger(__name__)

KEYCHAIN_DIR = ".relevo-keychains"
MAC_SECURITY = Path("/usr/bin/security")
PARTITION_LIST = "apple-tool:,apple:,codesign:"
# The tools that may use an imported key without asking (`import -T`); the partition list above
# is what lets them do so with no GUI session.
TRUSTED_TOOLS = ("/usr/bin/codesign", "/usr/bin/security", "/usr/bin/productbuild")
# The keychain locks itself this long after the stage's own time runs out (and on sleep).
LOCK_MARGIN_SEC = 300
# SecurityTool reads an interactive line into a buffer of 4096 bytes.
MAX_LINE = 4000


class KeychainFailure(Exception):
    def __init__(self, error_class: ErrorClass, message: str) -> None:
        super().__init__(message)
        self.error_class = error_class
        self.message = message


@dataclass(frozen=True)
class Identity:
    p12_ref: str
    p12: bytes
    passphrase: str


def read_identities(plan: SigningPlan) -> list[Identity]:
    """The identities of the plan from Secrets Manager: each .p12 as SecretBinary (bytes as stored;
    boto3 decodes the base64 of the wire, GetSecretValue: "When you retrieve a SecretBinary using
    the HTTP API, the Python SDK, or the Amazon Web Services CLI, the value is Base64-encoded"),
    each passphrase as SecretString."""
    secretsmanager = client("secretsmanager")
    found = []
    for identity in plan.identities:
        try:
            p12 = secretsmanager.get_secret_value(SecretId=identity.p12_ref)
            passphrase = secretsmanager.get_secret_value(SecretId=identity.passphrase_ref)
        except ClientError as exc:
            code = error_code(exc)
            raise KeychainFailure(
                ErrorClass.KEYCHAIN_FAILED,
                f"signing identity {identity.p12_ref}: Secrets Manager refused ({code})",
            ) from None
        except BotoCoreError as exc:
            raise KeychainFailure(
                ErrorClass.NETWORK_TIMEOUT,
                f"signing identity {identity.p12_ref}: Secrets Manager unreachable ({exc})",
            ) from None
        if "SecretBinary" not in p12:
            raise KeychainFailure(
                ErrorClass.KEYCHAIN_FAILED,
                f"signing identity {identity.p12_ref} is a SecretString: store the .p12 as SecretBinary "
                "(aws secretsmanager put-secret-value --secret-binary fileb://identity.p12)",
            )
        if "SecretString" not in passphrase:
            raise KeychainFailure(
                ErrorClass.KEYCHAIN_FAILED,
                f"signing passphrase {identity.passphrase_ref} must be a SecretString",
            )
        found.append(
            Identity(
                identity.p12_ref, bytes(p12["SecretBinary"]), str(passphrase["SecretString"]).rstrip("\r\n")
            )
        )
    return found


def _quoted(argument: str) -> str:
    """One argument of an interactive `security` line: double quotes, \\ and " escaped."""
    if any(ch in argument for ch in "\n\r\0"):
        raise KeychainFailure(
            ErrorClass.KEYCHAIN_FAILED,
            "a signing passphrase or path holds a line break or NUL, which `security -i` cannot take",
        )
    return '"' + argument.replace("\\", "\\\\").replace('"', '\\"') + '"'


class SecurityTool:
    def __init__(self, path: Path, timeout_sec: float) -> None:
        self.path = path
        self.timeout_sec = timeout_sec

    def run(self, *argv: str) -> str:
        """A command with nothing secret in its arguments."""
        return self._call([str(self.path), *argv], None, argv[0], ())

    def run_hidden(self, argv: list[str], hidden: tuple[str, ...]) -> str:
        """A command with secrets in it: a line on the stdin of `security -i`, never in argv."""
        line = " ".join(_quoted(argument) for argument in argv) + "\n"
        if len(line.encode()) > MAX_LINE:
            raise KeychainFailure(
                ErrorClass.KEYCHAIN_FAILED, f"security {argv[0]}: the command is over {MAX_LINE} bytes"
            )
        return self._call([str(self.path), "-i"], line, argv[0], hidden)

    def _call(self, argv: list[str], stdin: str | None, what: str, hidden: tuple[str, ...]) -> str:
        try:
            done = subprocess.run(
                argv,
                input=stdin if stdin is not None else "",
                capture_output=True,
                text=True,
                timeout=self.timeout_sec,
                check=False,
                start_new_session=True,  # no controlling terminal: nothing can prompt on one
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise KeychainFailure(
                ErrorClass.KEYCHAIN_FAILED, f"security {what} did not run ({exc.__class__.__name__})"
            ) from None
        # Interactive mode may end 0 after a failed command: its message on stderr says so.
        if done.returncode != 0 or done.stderr.strip():
            said = done.stderr.strip()
            for secret in hidden:
                said = said.replace(secret, "******")
            raise KeychainFailure(
                ErrorClass.KEYCHAIN_FAILED, f"security {what} failed (exit {done.returncode}): {said[-500:]}"
            )
        return done.stdout


def parse_search_list(output: str) -> list[str]:
    """`list-keychains` prints one quoted path a line, indented."""
    return [line.strip().strip('"') for line in output.splitlines() if line.strip()]


class Keychains:
    """The temporary signing keychains of this agent's stages, under <workspace_root>/.relevo-keychains."""

    def __init__(self, config: AgentConfig, system: str | None = None) -> None:
        self.directory = config.workspace_root / KEYCHAIN_DIR
        self.system = system or platform.system()
        tool = config.security_tool or (MAC_SECURITY if self.system == "Darwin" else None)
        self.security = SecurityTool(tool, config.security_timeout_sec) if tool is not None else None
        self.run_as = config.run_as

    def require(self) -> SecurityTool:
        """The security tool, or the failure of a stage that needs a keychain on an agent without one."""
        if self.run_as is not None:
            # A keychain and the search list codesign reads are a user's, kept by securityd and
            # cfprefsd in that user's login session. The agent is root and the build user has no
            # session: one made by root is root's, and `security` started as the build user from a
            # daemon acts on a session nobody can vouch for. Refused, before any secret is read.
            raise KeychainFailure(
                ErrorClass.KEYCHAIN_UNSUPPORTED,
                "the project's signing.keychain: temporary is not made on an agent with run_as "
                f"({self.run_as}): the keychain "
                "would be root's, not the build user's; run signing stages on agents without run_as "
                '(docs/agent.md, "A build user")',
            )
        if self.security is None:
            raise KeychainFailure(
                ErrorClass.KEYCHAIN_UNSUPPORTED,
                "the project's signing.keychain: temporary needs macOS's security tool; this agent runs on "
                f"{self.system} "
                "and was given no security_tool, so the stage is not run (never unsigned)",
            )
        return self.security

    def create(self, name: str, identities: list[Identity], lock_after_sec: int) -> Path:
        """A keychain holding `identities`, unlocked, first on the user's search list."""
        security = self.require()
        path = self.directory / f"{name}.keychain-db"
        password = secrets.token_hex(32)
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            security.run_hidden(["create-keychain", "-p", password, str(path)], (password,))
            security.run("set-keychain-settings", "-lut", str(lock_after_sec + LOCK_MARGIN_SEC), str(path))
            security.run_hidden(["unlock-keychain", "-p", password, str(path)], (password,))
            for index, identity in enumerate(identities):
                self._import(path, index, identity)
            security.run_hidden(
                ["set-key-partition-list", "-S", PARTITION_LIST, "-s", "-k", password, str(path)], (password,)
            )
            listed = self.search_list()
            security.run(
                "list-keychains",
                "-d",
                "user",
                "-s",
                str(path),
                *[other for other in listed if not self._ours(other)],
            )
        except BaseException:
            self.delete(path)
            raise
        log.info("signing keychain %s made with %d identities", path.name, len(identities))
        return path

    def _import(self, path: Path, index: int, identity: Identity) -> None:
        assert self.security is not None
        p12 = self.directory / f"{path.name.removesuffix('.keychain-db')}.{index}.p12"
        descriptor = os.open(p12, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(descriptor, "wb") as handle:
                handle.write(identity.p12)
            trusted = [argument for tool in TRUSTED_TOOLS for argument in ("-T", tool)]
            self.security.run_hidden(
                ["import", str(p12), "-k", str(path), "-f", "pkcs12", "-P", identity.passphrase, *trusted],
                (identity.passphrase,),
            )
        except KeychainFailure as failure:
            raise KeychainFailure(
                failure.error_class, f"signing identity {identity.p12_ref}: {failure.message}"
            ) from None
        finally:
            p12.unlink(missing_ok=True)

    def _ours(self, listed: str) -> bool:
        return Path(os.path.realpath(listed)).parent == Path(os.path.realpath(self.directory))

    def search_list(self) -> list[str]:
        assert self.security is not None
        return parse_search_list(self.security.run("list-keychains", "-d", "user"))

    def delete(self, path: Path) -> bool:
        """Off the user's search list, then deleted. False (logged) if either failed: the next
        start's sweep tries again."""
        if self.security is None:
            return True
        deleted = True
        try:
            listed = self.search_list()
            if any(self._ours(entry) and Path(entry).name == path.name for entry in listed):
                self.security.run(
                    "list-keychains",
                    "-d",
                    "user",
                    "-s",
                    *[entry for entry in listed if Path(entry).name != path.name or not self._ours(entry)],
                )
        except KeychainFailure as failure:
            log.warning(
                "signing keychain %s: could not take it off the search list (%s); the agent's next start "
                "tries again",
                path.name,
                failure,
            )
            deleted = False
        if path.exists():
            try:
                self.security.run("delete-keychain", str(path))
            except KeychainFailure as failure:
                log.warning(
                    "signing keychain %s: could not delete it (%s); the agent's next start tries again",
                    path.name,
                    failure,
                )
                deleted = False
        if deleted:
            log.info("signing keychain %s deleted", path.name)
        return deleted

    def sweep(self) -> list[Path]:
        """At the agent's start: the keychains a crash left, off the search list and deleted."""
        if self.security is None or not self.directory.is_dir():
            return []
        for p12 in self.directory.glob("*.p12"):
            p12.unlink(missing_ok=True)
        left = sorted(self.directory.glob("*.keychain-db"))
        try:
            listed = self.search_list()
            if any(self._ours(entry) for entry in listed):
                self.security.run(
                    "list-keychains",
                    "-d",
                    "user",
                    "-s",
                    *[entry for entry in listed if not self._ours(entry)],
                )
        except KeychainFailure as failure:
            log.warning(
                "leftover signing keychains: could not clean the search list (%s); the next start tries "
                "again",
                failure,
            )
        removed = []
        for path in left:
            log.warning(
                "signing keychain %s was left by an earlier run of this agent; deleting it", path.name
            )
            try:
                self.security.run("delete-keychain", str(path))
                removed.append(path)
            except KeychainFailure as failure:
                log.warning(
                    "signing keychain %s: could not delete it (%s); the next start tries again",
                    path.name,
                    failure,
                )
        return removed
