"""Where each stage's workspace comes from: the job's commit, checked out by the agent (a run
plan's `checkout`, relevo_core.models.plan)."""

# Annotations are evaluated as written (no `from __future__ import annotations`), as in plan.py.

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


# Where a project's Git credentials live in Secrets Manager: relevo/<stack>/_git/<project>/…
# (template.yaml, AgentPolicy: ReadGitCredentials). No project id starts with _.
GIT_SECRET = r"^relevo/[A-Za-z0-9-]+/_git/[a-z0-9][a-z0-9-]{0,62}/[A-Za-z0-9/_+=.@-]+$"
# What a checkout URL may be: https (or http for a mirror on the LAN), ssh (ssh:// or the scp-like
# user@host:path), file:// or an absolute path (mirrors and tests).
_GIT_URL = re.compile(
    r"^(https?://[^\s/@]+(:[0-9]+)?/\S+|ssh://\S+|[A-Za-z0-9._-]+@[A-Za-z0-9.-]+:\S+|file:///\S+|/\S*)$"
)


def checkout_url_problem(url: str) -> str | None:
    if re.match(r"^[a-z+]+://[^/]*@", url) and not url.startswith("ssh://"):
        return "carries credentials: put them in Secrets Manager and name the secret in credentials_ref"
    if url.startswith("git://"):
        return "git:// is neither authenticated nor encrypted: use https or ssh"
    if not _GIT_URL.match(url):
        return "is not an https, ssh or file:// URL, an scp-like user@host:path, or an absolute path"
    return None


class CheckoutPlan(_Frozen):
    """The source each stage's workspace is made of: the job's commit, checked out by the agent."""

    url: str = Field(
        min_length=1,
        max_length=1024,
        description="The repository: https://…, ssh://… or git@host:owner/repo.git, file://… or an absolute "
        "path "
        "(a mirror on the Mac, tests). Never with credentials in it: those go in credentials_ref.",
    )
    credentials_ref: str | None = Field(
        default=None,
        max_length=512,
        pattern=GIT_SECRET,
        description="Secrets Manager name of the credentials, under relevo/<stack>/_git/<project>/: for "
        "https a "
        'token (the SecretString itself, or JSON {"username", "password"}), for ssh JSON {"ssh_private_key", '
        "\"known_hosts\"}. Only the agent's git processes get them: never the stage's environment, its log, "
        "the "
        "workspace or .git/config. Default: none (a public or local repository).",
    )
    submodules: bool = Field(
        default=False, description="Also check out the submodules (recursively), with the same credentials."
    )
    lfs: bool = Field(
        default=False, description="Also fetch Git LFS objects (git-lfs must be installed on the agent)."
    )
    timeout_sec: int = Field(
        default=900,
        ge=10,
        le=7200,
        description="The longest the fetch may take (whatever the network does; then the stage fails "
        "Relevo.Transient.NetworkTimeout and is retried). The whole checkout also counts against the "
        "stage's exec_timeout_sec.",
    )
    clean: bool = Field(
        default=True,
        description="git clean -ffdx after the checkout: nothing of an earlier job (build products, "
        "untracked files, "
        "ignored files) stays in the workspace. false keeps them, for tools with a warm cache of their own "
        "(DerivedData "
        "inside the workspace); leftovers then may reach a later job.",
    )

    @field_validator("url")
    @classmethod
    def _url(cls, url: str) -> str:
        problem = checkout_url_problem(url)
        if problem:
            raise ValueError(f"{url!r} {problem}")
        return url
