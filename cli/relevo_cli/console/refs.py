"""The run page's branch and tag list: `git ls-remote` run by the operator's own git, so their
credentials (credential helper, SSH agent) decide what they can list, as on their terminal."""

from __future__ import annotations

import os
import subprocess
from typing import Any
from urllib.parse import urlsplit

LS_REMOTE_TIMEOUT_SEC = 20
# What the run page says when the branches cannot be listed: one line, and the way on.
TYPE_ONE = "Could not list the branches: type a branch or tag"
# git's words for why `ls-remote` failed, and what they mean to the person at the page.
_GIT_SAYS = (
    (
        ("could not resolve host", "name or service not known", "temporary failure in name resolution"),
        "{host} could not be resolved: offline, or no DNS",
    ),
    (
        (
            "connection refused",
            "connection timed out",
            "network is unreachable",
            "failed to connect",
            "couldn't connect",
        ),
        "{host} could not be reached",
    ),
    (
        (
            "authentication failed",
            "could not read username",
            "terminal prompts disabled",
            "permission denied",
            "403",
        ),
        "your git credentials cannot read {url}",
    ),
    (
        ("repository not found", "not found", "does not appear to be a git repository", "404"),
        "no repository at {url} that your git credentials can see",
    ),
)


def _host(url: str) -> str:
    return urlsplit(url).hostname or url


def why_not_listed(url: str, stderr: str) -> str:
    """Why `git ls-remote` could not list the repository, in a few words rather than git's."""
    said = stderr.lower()
    for needles, words in _GIT_SAYS:
        if any(needle in said for needle in needles):
            return words.format(host=_host(url), url=url)
    return f"git ls-remote {url} failed"


def remote_url(project: dict[str, Any], base_url: str | None) -> str:
    """Where a project's repository (owner/name, as its webhooks name it) is fetched from:
    `base_url` + repo + .git when given (GitHub Enterprise, a mirror), else GitLab's or GitHub's."""
    if base_url:
        return f"{base_url.rstrip('/')}/{project['repo']}.git"
    host = "gitlab.com" if (project.get("webhook") or {}).get("gitlab_token_ref") else "github.com"
    return f"https://{host}/{project['repo']}.git"


def list_refs(url: str) -> dict[str, Any]:
    """Branches and tags of the repository, or why they could not be listed in one line (`error`;
    git's own last line is `detail`): the page still takes a ref typed in."""
    try:
        listed = subprocess.run(
            ["git", "ls-remote", "--heads", "--tags", url],
            capture_output=True,
            text=True,
            timeout=LS_REMOTE_TIMEOUT_SEC,
            env={**os.environ, "GIT_TERMINAL_PROMPT": "0"},  # never wait for a password prompt
        )
    except FileNotFoundError:
        return {"refs": [], "error": f"{TYPE_ONE} (git is not installed on this machine)", "detail": None}
    except subprocess.TimeoutExpired:
        return {
            "refs": [],
            "error": f"{TYPE_ONE} ({_host(url)} did not answer within {LS_REMOTE_TIMEOUT_SEC} s)",
            "detail": None,
        }
    if listed.returncode != 0:
        last = (listed.stderr.strip().splitlines() or [f"exit {listed.returncode}"])[-1]
        return {"refs": [], "error": f"{TYPE_ONE} ({why_not_listed(url, listed.stderr)})", "detail": last}
    refs = []
    for line in listed.stdout.splitlines():
        _sha, _, name = line.partition("\t")
        if name.endswith("^{}"):
            continue  # a tag's peeled commit: the tag itself is listed already
        for prefix, kind in (("refs/heads/", "branch"), ("refs/tags/", "tag")):
            if name.startswith(prefix):
                refs.append({"name": name[len(prefix) :], "kind": kind})
    return {"refs": refs, "error": None, "detail": None}
