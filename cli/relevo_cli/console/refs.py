"""The run page's branch and tag list: `git ls-remote` run by the operator's own git, so their
credentials (credential helper, SSH agent) decide what they can list, as on their terminal."""

from __future__ import annotations

import os
import subprocess
from typing import Any

LS_REMOTE_TIMEOUT_SEC = 20


def remote_url(project: dict[str, Any], base_url: str | None) -> str:
    """Where a project's repository (owner/name, as its webhooks name it) is fetched from:
    `base_url` + repo + .git when given (GitHub Enterprise, a mirror), else GitLab's or GitHub's."""
    if base_url:
        return f"{base_url.rstrip('/')}/{project['repo']}.git"
    host = "gitlab.com" if (project.get("webhook") or {}).get("gitlab_token_ref") else "github.com"
    return f"https://{host}/{project['repo']}.git"


def list_refs(url: str) -> dict[str, Any]:
    """Branches and tags of the repository, or why they could not be listed (the page still
    takes a ref typed in)."""
    try:
        listed = subprocess.run(
            ["git", "ls-remote", "--heads", "--tags", url],
            capture_output=True, text=True, timeout=LS_REMOTE_TIMEOUT_SEC,
            env={**os.environ, "GIT_TERMINAL_PROMPT": "0"},  # never wait for a password prompt
        )
    except FileNotFoundError:
        return {"refs": [], "error": "git is not installed"}
    except subprocess.TimeoutExpired:
        return {"refs": [], "error": f"git ls-remote {url}: no answer within {LS_REMOTE_TIMEOUT_SEC}s"}
    if listed.returncode != 0:
        last = (listed.stderr.strip().splitlines() or [f"exit {listed.returncode}"])[-1]
        return {"refs": [], "error": f"git ls-remote {url}: {last}"}
    refs = []
    for line in listed.stdout.splitlines():
        _sha, _, name = line.partition("\t")
        if name.endswith("^{}"):
            continue  # a tag's peeled commit: the tag itself is listed already
        for prefix, kind in (("refs/heads/", "branch"), ("refs/tags/", "tag")):
            if name.startswith(prefix):
                refs.append({"name": name[len(prefix):], "kind": kind})
    return {"refs": refs, "error": None}
