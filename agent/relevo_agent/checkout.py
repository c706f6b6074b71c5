"""Before a stage's command: the workspace made the job's commit (a project's `checkout:`).

    <workspace_root>/.relevo-git/<id>.git   a bare mirror of the repository, one per URL on this Mac,
                                            shared by the agents of the Mac under an flock
    <workspace_root>/<project>              the workspace: a repository of its own whose objects
                                            come from the mirror (objects/info/alternates), so a
                                            checkout moves nothing over the network that the Mac has

1. Under the mirror's lock: a known commit already in the mirror needs no fetch at all; otherwise
   the mirror fetches its branches and tags (and the ref, for refs/pull/… and the like), bounded by
   `timeout_sec` and the stage's exec deadline, whichever comes first, on this process's monotonic
   clock (the fetch's process group is killed then: Relevo.Transient.NetworkTimeout).
2. Which commit: the trigger's; else the ref resolved in the mirror, recorded on the job through
   `record_commit` (a fenced write that keeps the first commit recorded), so every later stage,
   retry and rerun builds that commit even if the branch moves meanwhile.
3. The workspace fetches that commit (and the tags) from the mirror, checks it out by force
   (detached) and, unless `clean: false`, runs `git clean -ffdx`.

Credentials (`credentials_ref`, Secrets Manager) reach only the git processes that talk to the
remote: an askpass helper (https) or an identity file (ssh) in a private temporary directory,
removed after each command. Never the stage's environment, its log, the workspace or any
.git/config; the credential helpers of the Mac's git configuration are switched off for these
commands (an osxkeychain helper would keep the token). With a build user (`run_as`) the git of the
workspace runs as that user (`checkout`), and its submodule and LFS steps get a copy of these
files of their own, that user's while they run: the project's token, never the agent's.

Failures: a commit the repository does not have, credentials refused, a repository or ref that
does not exist are Relevo.Fatal.Checkout; a timeout is Relevo.Transient.NetworkTimeout; any other
trouble talking to the remote is Relevo.Transient.ConnectionReset (a checkout is safe to repeat).

The git commands themselves, bounded, and what they fail with are relevo_agent.git_commands'; the
credentials' files relevo_agent.git_credentials'.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shlex
import shutil
import stat
import subprocess
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from relevo_agent.build_user import BuildUser
from relevo_agent.git_commands import CheckoutFailure, Git, locked
from relevo_agent.git_credentials import credential_files, git_secret
from relevo_agent.stage_env import without_agent_credentials
from relevo_core.models.checkout_plan import CheckoutPlan
from relevo_core.models.errors import ErrorClass

log = logging.getLogger(__name__)

MIRRORS_DIR = ".relevo-git"
# Commands on the local mirror and workspace only (no network): a bound all the same.
LOCAL_TIMEOUT_SEC = 600.0
_COMMIT = re.compile(r"^[0-9a-f]{7,64}$")


@dataclass(frozen=True)
class CheckoutResult:
    commit: str
    fetched: bool
    seconds: float


def mirror_path(workspace_root: Path, url: str) -> Path:
    return workspace_root / MIRRORS_DIR / f"{hashlib.sha256(url.encode()).hexdigest()[:24]}.git"


def _has_commit(git: Git, mirror: Path, commit: str) -> bool:
    return (
        git.run(
            ["-C", str(mirror), "cat-file", "-e", f"{commit}^{{commit}}"],
            check=False,
            limit=LOCAL_TIMEOUT_SEC,
        ).returncode
        == 0
    )


def _refspecs(ref: str) -> list[str]:
    specs = ["+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*"]
    if ref.startswith("refs/") and not ref.startswith(("refs/heads/", "refs/tags/")):
        specs.append(
            f"+{ref}:refs/relevo/{ref.removeprefix('refs/')}"
        )  # refs/pull/N/head, refs/merge-requests/N/head
    return specs


def _resolve(git: Git, mirror: Path, ref: str) -> str | None:
    candidates = [ref] if ref.startswith("refs/") else [f"refs/heads/{ref}", f"refs/tags/{ref}", ref]
    if ref.startswith("refs/") and not ref.startswith(("refs/heads/", "refs/tags/")):
        candidates.insert(0, f"refs/relevo/{ref.removeprefix('refs/')}")
    for candidate in candidates:
        found = git.run(
            ["-C", str(mirror), "rev-parse", "--verify", "--quiet", f"{candidate}^{{commit}}"],
            check=False,
            limit=LOCAL_TIMEOUT_SEC,
        )
        if found.returncode == 0 and found.stdout.strip():
            return found.stdout.strip()
    return None


def _prepare_mirror(git: Git, mirror: Path, url: str) -> None:
    if (mirror / "HEAD").exists():
        return
    partial = mirror.with_name(mirror.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    git.run(["init", "--bare", "--quiet", str(partial)], limit=LOCAL_TIMEOUT_SEC)
    for name, value in (
        ("remote.origin.url", url),
        ("uploadpack.allowAnySHA1InWant", "true"),
        ("gc.auto", "0"),
    ):
        git.run(["-C", str(partial), "config", name, value], limit=LOCAL_TIMEOUT_SEC)
    os.replace(partial, mirror)


def _fetch(
    git: Git, mirror: Path, ref: str, commit: str | None, credentials: dict[str, str], timeout_sec: float
) -> None:
    git.run(
        ["-C", str(mirror), "fetch", "--quiet", "--prune", "--force", "origin", *_refspecs(ref)],
        env=credentials,
        limit=timeout_sec,
        what="fetch",
    )
    if commit and not _has_commit(git, mirror, commit):
        # A commit no branch or tag reaches any more (a force-push): asked for by its id.
        git.run(
            ["-C", str(mirror), "fetch", "--quiet", "origin", commit],
            env=credentials,
            limit=timeout_sec,
            check=False,
            what="fetch",
        )


def checkout(
    plan: CheckoutPlan,
    workspace_root: Path,
    workspace: Path,
    ref: str,
    commit: str | None,
    record_commit: Callable[[str], str],
    deadline: float,
    cancel: threading.Event,
    emit: Callable[[str], None],
    user: BuildUser | None = None,
) -> CheckoutResult:
    """Make `workspace` the job's commit; returns it. Raises CheckoutFailure or CheckoutStopped.

    With a build `user`, the mirror stays the agent's and everything in the workspace is done as
    that user: root never runs git in a repository whose config (core.fsmonitor, a filter driver,
    a submodule's update command) a build could have written. The user's fetch from the mirror
    names it safe for the upload-pack that reads it (git refuses a repository of another owner,
    and passes no -c to that process)."""
    started = time.monotonic()
    mirror = mirror_path(workspace_root, plan.url)
    fetched = False
    secret = git_secret(plan.credentials_ref) if plan.credentials_ref else None
    with ExitStack() as stack:
        credentials, masked = (
            stack.enter_context(credential_files(secret)) if secret is not None else ({}, [])
        )
        git = Git(deadline, cancel, masked)
        with locked(mirror.with_suffix(".lock"), deadline, cancel):
            _prepare_mirror(git, mirror, plan.url)
            if commit is None or not _has_commit(git, mirror, commit):
                emit(
                    f"[relevo] checkout: fetching {plan.url} "
                    f"({'commit ' + commit[:12] if commit else 'ref ' + ref})"
                )
                _fetch(git, mirror, ref, commit, credentials, plan.timeout_sec)
                fetched = True
            if commit is None:
                resolved = _resolve(git, mirror, ref)
                if resolved is None:
                    raise CheckoutFailure(
                        ErrorClass.CHECKOUT_FAILED, f"checkout: {plan.url} has no branch, tag or ref {ref!r}"
                    )
                commit = record_commit(resolved)
                if commit != resolved:
                    emit(
                        f"[relevo] checkout: {ref} is {resolved[:12]} now; this job builds {commit[:12]}, "
                        "the commit its first checkout recorded"
                    )
                if not _has_commit(git, mirror, commit):
                    _fetch(git, mirror, ref, commit, credentials, plan.timeout_sec)
                    fetched = True
            if not _COMMIT.match(commit) or not _has_commit(git, mirror, commit):
                raise CheckoutFailure(
                    ErrorClass.CHECKOUT_FAILED,
                    f"checkout: commit {commit} is not in {plan.url} (after fetching its branches, tags and "
                    f"{ref})",
                )
            full = git.run(
                ["-C", str(mirror), "rev-parse", f"{commit}^{{commit}}"], limit=LOCAL_TIMEOUT_SEC
            ).stdout.strip()
        _workspace_repository(git, mirror, workspace, user)
        upload_pack: list[str] = []
        if user is not None:
            git = Git(deadline, cancel, masked, user)
            upload_pack = [f"--upload-pack=git -c safe.directory={shlex.quote(str(mirror))} upload-pack"]
        # From the mirror: local, no credentials (the workspace never knows the remote).
        git.run(
            [
                "-C",
                str(workspace),
                "fetch",
                "--quiet",
                "--force",
                "--no-write-fetch-head",
                *upload_pack,
                str(mirror),
                full,
                "+refs/tags/*:refs/tags/*",
            ],
            limit=LOCAL_TIMEOUT_SEC,
            what="fetch (from the mirror)",
        )
        git.run(
            ["-C", str(workspace), "checkout", "--quiet", "--force", "--detach", full],
            limit=LOCAL_TIMEOUT_SEC,
            what="checkout",
        )
        if plan.clean:
            git.run(
                ["-C", str(workspace), "clean", "-ffdx", "--quiet"], limit=LOCAL_TIMEOUT_SEC, what="clean"
            )
        if user is not None and secret is not None and (plan.submodules or plan.lfs):
            # The steps that talk to the remote as the build user get a copy of their own.
            credentials = stack.enter_context(credential_files(secret, user, mirror.parent))[0]
        if plan.submodules:
            git.run(
                ["-C", str(workspace), "submodule", "sync", "--quiet", "--recursive"],
                limit=LOCAL_TIMEOUT_SEC,
                what="submodule sync",
            )
            git.run(
                ["-C", str(workspace), "submodule", "update", "--quiet", "--init", "--recursive", "--force"],
                env=credentials,
                limit=plan.timeout_sec,
                what="submodule update",
            )
            if plan.clean:
                git.run(
                    [
                        "-C",
                        str(workspace),
                        "submodule",
                        "foreach",
                        "--quiet",
                        "--recursive",
                        "git clean -ffdx --quiet",
                    ],
                    limit=LOCAL_TIMEOUT_SEC,
                    what="submodule clean",
                )
        if plan.lfs:
            if shutil.which("git-lfs") is None:
                raise CheckoutFailure(
                    ErrorClass.CHECKOUT_FAILED,
                    "checkout: lfs is on but git-lfs is not installed on this agent",
                )
            git.run(
                ["-C", str(workspace), "-c", f"remote.origin.url={plan.url}", "lfs", "pull", plan.url],
                env={**credentials, "GIT_LFS_SKIP_SMUDGE": "0"},
                limit=plan.timeout_sec,
                what="lfs pull",
            )
    seconds = time.monotonic() - started
    emit(
        f"[relevo] checkout: {full[:12]} ({ref}) in "
        f"{seconds:.1f}s{' after a fetch' if fetched else ', nothing fetched'}"
    )
    return CheckoutResult(full, fetched, seconds)


def _workspace_repository(git: Git, mirror: Path, workspace: Path, user: BuildUser | None) -> None:
    """`workspace` a repository whose objects come from `mirror`; anything else there (a
    workspace from before `checkout:`, another repository's) is replaced. A new one is made by the
    agent in a directory no one else can write yet, then handed to the build user, if any."""
    alternates = workspace / ".git" / "objects" / "info" / "alternates"
    objects = str((mirror / "objects").resolve())
    if _small_file(alternates).strip() == objects:
        if user is not None:
            user.adopt(workspace)  # an agent's workspace from before run_as
        return
    if workspace.exists():
        shutil.rmtree(workspace)
    workspace.mkdir(parents=True)
    git.run(["init", "--quiet", str(workspace)], limit=LOCAL_TIMEOUT_SEC)
    alternates.write_text(objects + "\n")
    # The agent's own files in the workspace are not the build's: `git status` stays clean.
    with open(workspace / ".git" / "info" / "exclude", "a") as exclude:
        exclude.write("/.relevo-artifacts/\n")
    if user is not None:
        user.hand_over(workspace)


def _small_file(path: Path) -> str:
    """The text of a small regular file of the workspace, or "": never through a link, never
    waiting on a FIFO a build may have put there."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return ""
    try:
        return os.read(fd, 65536).decode(errors="replace") if stat.S_ISREG(os.fstat(fd).st_mode) else ""
    finally:
        os.close(fd)


def inside_git_work_tree(path: Path) -> Path | None:
    """The top of the git work tree `path` (or its nearest existing ancestor) lies in, or None."""
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        found = subprocess.run(
            ["git", "-C", str(probe), "rev-parse", "--show-toplevel"],
            capture_output=True,
            text=True,
            timeout=10,
            env={**without_agent_credentials(os.environ), "GIT_CEILING_DIRECTORIES": ""},
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    top = found.stdout.strip()
    return Path(top) if found.returncode == 0 and top else None
