"""What a verified webhook delivery means to Relevo: a trigger, an explicit ignore, or a ping.

Parsing is pure (no AWS, no I/O). The GitHub and GitLab readers turn a delivery's event name, delivery
id and decoded JSON body into one of these values; a body of the wrong shape raises pydantic's
ValidationError, which the caller maps to a 422.
"""

# Annotations are evaluated as written (no `from __future__ import annotations`): pydantic would
# otherwise parse and evaluate each one again, at cold start, to build the models.

from dataclasses import dataclass
from typing import Annotated, TypeAlias

from pydantic import BaseModel, ConfigDict, Field

# A full commit id: SHA-1 (40 hex) or SHA-256 (64 hex), lower case as both hosts send it.
SHA_PATTERN = r"^[0-9a-f]{40}(?:[0-9a-f]{24})?$"
Sha = Annotated[str, Field(pattern=SHA_PATTERN)]

BRANCH_PREFIX = "refs/heads/"
TAG_PREFIX = "refs/tags/"
PULL_PREFIX = "refs/pull/"
PULL_HEAD_SUFFIX = "/head"
# GitTrigger.fork of a pull request whose head repository was deleted (GitHub sends head.repo null).
DELETED_FORK = "(deleted fork)"


def pull_request_ref(number: int) -> str:
    """The ref that holds a pull request's head commits in the base repository."""
    return f"{PULL_PREFIX}{number}{PULL_HEAD_SUFFIX}"


@dataclass(frozen=True)
class GitTrigger:
    """A delivery that starts a job: build `commit` of `repo`, reached through `ref`."""

    source: str  # "github" | "gitlab"
    event: str  # e.g. "push", "create", "pull_request", "Push Hook", "Tag Push Hook"
    repo: str  # "owner/name" (GitHub full_name) or GitLab path_with_namespace
    ref: str  # full ref: refs/heads/x, refs/tags/v1, or refs/pull/N/head for pull requests
    commit: str  # 40-hex (or 64-hex) commit id that will be built
    delivery_id: str | None
    actor: str | None  # pusher / sender login / user_username
    # The head repository's full name when a pull request comes from a fork (DELETED_FORK when the
    # fork is gone); None for pushes, tags and pull requests from a branch of `repo` itself.
    fork: str | None = None

    @property
    def pull_request_number(self) -> str | None:
        """N of refs/pull/N/head; None for any other ref."""
        if self.ref.startswith(PULL_PREFIX) and self.ref.endswith(PULL_HEAD_SUFFIX):
            return self.ref[len(PULL_PREFIX) : -len(PULL_HEAD_SUFFIX)]
        return None


@dataclass(frozen=True)
class Ignored:
    """A well-formed delivery that does not start a job, and why."""

    reason: str


@dataclass(frozen=True)
class Pong:
    """GitHub's ping, sent when a webhook is created: answer it, start nothing."""


WebhookResult: TypeAlias = GitTrigger | Ignored | Pong


def is_zero_sha(sha: str) -> bool:
    """True for the all-zeros id both hosts use for "no commit" (a created or deleted ref)."""
    return bool(sha) and set(sha) == {"0"}


class Payload(BaseModel):
    """Base for webhook payload shapes: unknown keys are ignored, known keys must have their exact JSON
    type (strict: "yes" is not a bool, 5 is not a string), so a wrong shape is a ValidationError and
    never a KeyError or TypeError further on."""

    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)
