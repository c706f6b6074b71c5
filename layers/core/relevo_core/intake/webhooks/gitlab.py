"""GitLab webhooks: the payload shapes Relevo reads, and what each event means.

GitLab does not sign bodies: it sends the webhook's secret token verbatim in X-Gitlab-Token, so the
check (verify.py, imported here too) is a constant-time comparison of that header with the
project's secret.
"""

# Annotations are evaluated as written (no `from __future__ import annotations`): pydantic would
# otherwise parse and evaluate each one again, at cold start, to build the models.

from pydantic import Field

from relevo_core.intake.webhooks.events import (
    BRANCH_PREFIX,
    TAG_PREFIX,
    GitTrigger,
    Ignored,
    Payload,
    Sha,
    is_zero_sha,
)

# The token check lives with GitHub's signature check, apart from the payload shapes below.
from relevo_core.intake.webhooks.verify import (  # noqa: F401  (verify_token: this module's API)
    GITLAB_DELIVERY_HEADER,
    GITLAB_EVENT_HEADER,
    GITLAB_TOKEN_HEADER,
    verify_token,
)

TOKEN_HEADER = GITLAB_TOKEN_HEADER
EVENT_HEADER = GITLAB_EVENT_HEADER
DELIVERY_HEADER = GITLAB_DELIVERY_HEADER
SOURCE = "gitlab"

PUSH_HOOK = "Push Hook"
TAG_PUSH_HOOK = "Tag Push Hook"


class Project(Payload):
    path_with_namespace: str = Field(min_length=1)


class PushHook(Payload):
    """The body of both "Push Hook" and "Tag Push Hook" deliveries (they share one shape)."""

    ref: str = Field(min_length=1)
    before: Sha = "0" * 40
    after: Sha
    # The commit at the ref after the push; null when the ref was deleted. For a tag it is the tagged
    # commit, whereas `after` is the tag object's id for an annotated tag.
    checkout_sha: Sha | None = None
    user_username: str | None = None
    project: Project

    @property
    def is_deletion(self) -> bool:
        # checkout_sha *sent as null* marks a deletion; a payload without the key at all (very old
        # GitLab) is judged by `after` alone.
        sent_null = "checkout_sha" in self.model_fields_set and self.checkout_sha is None
        return is_zero_sha(self.after) or sent_null

    @property
    def commit(self) -> str:
        return self.checkout_sha or self.after


def parse_gitlab(event: str, delivery_id: str | None, payload: object) -> GitTrigger | Ignored:
    """What a verified GitLab delivery means: a build trigger or an explicit ignore.

    `event` is the X-Gitlab-Event header, `delivery_id` the X-Gitlab-Event-UUID header, `payload` the
    decoded JSON body. A push body that lacks a key Relevo needs, or has one of the wrong type, raises
    pydantic.ValidationError; events that start nothing are not validated.
    """
    if event == PUSH_HOOK:
        return _from_push(event, BRANCH_PREFIX, "branch", delivery_id, PushHook.model_validate(payload))
    if event == TAG_PUSH_HOOK:
        return _from_push(event, TAG_PREFIX, "tag", delivery_id, PushHook.model_validate(payload))
    return Ignored(f"event {event or '(none)'} does not start jobs")


def _from_push(
    event: str, prefix: str, kind: str, delivery_id: str | None, push: PushHook
) -> GitTrigger | Ignored:
    if not push.ref.startswith(prefix):
        return Ignored(f"{event} for {push.ref} is not a {kind} push")
    if push.is_deletion:
        return Ignored(f"{push.ref} was deleted")
    return GitTrigger(
        source=SOURCE,
        event=event,
        repo=push.project.path_with_namespace,
        ref=push.ref,
        commit=push.commit,
        delivery_id=delivery_id,
        actor=push.user_username or None,
    )
