"""GitHub webhooks: the payload shapes Relevo reads, and what each event means. The signature check
over the raw body is in verify.py (imported here too)."""

# Annotations are evaluated as written (no `from __future__ import annotations`): pydantic would
# otherwise parse and evaluate each one again, at cold start, to build the models.

from pydantic import Field

from relevo_core.intake.webhooks.events import (
    BRANCH_PREFIX,
    DELETED_FORK,
    TAG_PREFIX,
    GitTrigger,
    Ignored,
    Payload,
    Pong,
    Sha,
    is_zero_sha,
    pull_request_ref,
)

# The signature check lives with GitLab's token check, apart from the payload shapes below.
from relevo_core.intake.webhooks.verify import (  # noqa: F401  (sign, verify_signature: this module's API)
    GITHUB_DELIVERY_HEADER,
    GITHUB_EVENT_HEADER,
    GITHUB_SIGNATURE_HEADER,
    sign,
    verify_signature,
)

SIGNATURE_HEADER = GITHUB_SIGNATURE_HEADER
EVENT_HEADER = GITHUB_EVENT_HEADER
DELIVERY_HEADER = GITHUB_DELIVERY_HEADER
ZERO_SHA = "0" * 40
SOURCE = "github"

# pull_request actions that put new code at refs/pull/N/head; the rest (closed, edited, labeled, ...)
# do not change what would be built.
PULL_REQUEST_BUILD_ACTIONS = frozenset({"opened", "synchronize", "reopened"})


# ------------------------------------------------------------------------------------------------
# Payload shapes. Only the keys Relevo reads are declared; everything else GitHub sends is ignored.


class Repository(Payload):
    full_name: str = Field(min_length=1)


class Pusher(Payload):
    name: str | None = None


class User(Payload):
    login: str


class Commit(Payload):
    id: Sha


class PushEvent(Payload):
    ref: str = Field(min_length=1)
    before: Sha = ZERO_SHA
    after: Sha
    deleted: bool = False
    repository: Repository
    pusher: Pusher | None = None
    sender: User | None = None
    # null when a ref is deleted; for a tag it is the commit the tag points at.
    head_commit: Commit | None = None

    @property
    def is_deletion(self) -> bool:
        return self.deleted or is_zero_sha(self.after)

    @property
    def commit(self) -> str:
        """The commit to build. For an annotated tag `after` is the id of the tag *object*, not of a
        commit, so a tag push builds head_commit.id (the tagged commit) when GitHub sends it."""
        if self.ref.startswith(TAG_PREFIX) and self.head_commit is not None:
            return self.head_commit.id
        return self.after

    @property
    def actor(self) -> str | None:
        if self.pusher is not None and self.pusher.name:
            return self.pusher.name
        return self.sender.login if self.sender is not None else None


class CreateEvent(Payload):
    ref: str = Field(min_length=1)  # the short name: "v1.2.0", not "refs/tags/v1.2.0"
    ref_type: str  # "tag" | "branch"
    repository: Repository
    sender: User | None = None
    head_commit: Commit | None = None  # not in GitHub's documented create payload; read if present


class PullRequestHead(Payload):
    sha: Sha
    # The repository the head commits come from; null when that repository (a fork) was deleted.
    repo: Repository | None = None


class PullRequest(Payload):
    number: int = Field(gt=0)
    head: PullRequestHead


class PullRequestEvent(Payload):
    action: str
    pull_request: PullRequest
    repository: Repository  # the base repository, also for pull requests from forks
    sender: User | None = None

    @property
    def fork(self) -> str | None:
        """The head repository's full name when it is not the base repository (refs/pull/N/head
        then holds someone else's commits), DELETED_FORK when it is gone; None for a branch of the
        base repository itself."""
        head_repo = self.pull_request.head.repo
        if head_repo is None:
            return DELETED_FORK
        if head_repo.full_name.lower() != self.repository.full_name.lower():
            return head_repo.full_name
        return None


# ------------------------------------------------------------------------------------------------
# Event → trigger


def parse_github(event: str, delivery_id: str | None, payload: object) -> GitTrigger | Ignored | Pong:
    """What a verified GitHub delivery means: a build trigger, an explicit ignore, or a ping.

    `event` is the X-GitHub-Event header, `delivery_id` the X-GitHub-Delivery header, `payload` the
    decoded JSON body. A body that lacks a key Relevo needs, or has one of the wrong type, raises
    pydantic.ValidationError (never KeyError/TypeError); events that start nothing are not validated.
    """
    if event == "ping":
        return Pong()
    if event == "push":
        return _from_push(delivery_id, PushEvent.model_validate(payload))
    if event == "create":
        return _from_create(delivery_id, CreateEvent.model_validate(payload))
    if event == "pull_request":
        return _from_pull_request(delivery_id, PullRequestEvent.model_validate(payload))
    return Ignored(f"event {event or '(none)'} does not start jobs")


def _from_push(delivery_id: str | None, push: PushEvent) -> GitTrigger | Ignored:
    if push.is_deletion:
        return Ignored(f"{push.ref} was deleted")
    if not push.ref.startswith((BRANCH_PREFIX, TAG_PREFIX)):
        return Ignored(f"push to {push.ref} is neither a branch nor a tag")
    return GitTrigger(
        source=SOURCE,
        event="push",
        repo=push.repository.full_name,
        ref=push.ref,
        commit=push.commit,
        delivery_id=delivery_id,
        actor=push.actor,
    )


def _from_create(delivery_id: str | None, create: CreateEvent) -> GitTrigger | Ignored:
    """A `create` event for a tag starts a job only if it names the commit.

    GitHub's documented create payload carries no commit id (only the ref name, ref_type and
    master_branch), and GitHub also sends a `push` event for every new tag, which does carry it. So a
    create event without head_commit is an explicit Ignored: the tag's push event starts the job.
    Creating a branch never starts a job here; pushes to it do.
    """
    if create.ref_type != "tag":
        return Ignored(f"create event for {create.ref_type} {create.ref} does not start jobs")
    if create.head_commit is None:
        return Ignored(
            f"create event for tag {create.ref} carries no commit; the tag's push event starts the job"
        )
    return GitTrigger(
        source=SOURCE,
        event="create",
        repo=create.repository.full_name,
        ref=TAG_PREFIX + create.ref,
        commit=create.head_commit.id,
        delivery_id=delivery_id,
        actor=create.sender.login if create.sender is not None else None,
    )


def _from_pull_request(delivery_id: str | None, event: PullRequestEvent) -> GitTrigger | Ignored:
    if event.action not in PULL_REQUEST_BUILD_ACTIONS:
        return Ignored(f"pull_request action {event.action} does not start jobs")
    return GitTrigger(
        source=SOURCE,
        event="pull_request",
        repo=event.repository.full_name,
        ref=pull_request_ref(event.pull_request.number),
        commit=event.pull_request.head.sha,
        delivery_id=delivery_id,
        actor=event.sender.login if event.sender is not None else None,
        fork=event.fork,
    )
