"""Webhook deliveries (GitHub and GitLab) read into a trigger, an explicit ignore, or a pong.

Payloads are fixtures under tests/unit/fixtures/, shaped on the hosts' documented webhook examples.
"""

from __future__ import annotations

import copy
import dataclasses
import hmac
import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from relevo_core.intake.webhooks import github, gitlab
from relevo_core.intake.webhooks.events import GitTrigger, Ignored, Pong
from relevo_core.models.errors import ErrorCode, RelevoError

FIXTURES = Path(__file__).parent / "fixtures"
DELIVERY = "72d3162e-cc78-11e3-81ab-4c9367dc0958"


def load(name: str) -> dict[str, Any]:
    """A fresh copy of a fixture payload, safe to mutate."""
    return json.loads((FIXTURES / f"{name}.json").read_text())


def as_trigger(result: object) -> GitTrigger:
    assert isinstance(result, GitTrigger), result
    return result


def as_ignored(result: object) -> Ignored:
    assert isinstance(result, Ignored), result
    return result


# --------------------------------------------------------------------------------------------
# Result types


def test_results_are_frozen() -> None:
    """Given each result type, when a field is assigned, then it refuses: results are values."""
    trigger = GitTrigger("github", "push", "a/b", "refs/heads/main", "a" * 40, None, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        trigger.commit = "b" * 40  # type: ignore[misc]  # the write refused
    with pytest.raises(dataclasses.FrozenInstanceError):
        Ignored("x").reason = "y"  # type: ignore[misc]  # the write refused
    assert Pong() == Pong()


# --------------------------------------------------------------------------------------------
# GitHub: ping


def test_github_ping_is_a_pong() -> None:
    """Given GitHub's ping (zen, hook_id), when parsed, then it is a Pong and starts nothing."""
    payload = load("github_ping")
    assert payload["zen"] and payload["hook_id"]
    assert github.parse_github("ping", DELIVERY, payload) == Pong()


def test_github_ping_needs_no_repository() -> None:
    """Given an organization-level ping (no repository key), when parsed, then it is still a Pong."""
    payload = load("github_ping")
    del payload["repository"]
    assert isinstance(github.parse_github("ping", DELIVERY, payload), Pong)


# --------------------------------------------------------------------------------------------
# GitHub: push


def test_github_push_to_a_branch_is_a_trigger() -> None:
    """Given a push to refs/heads/main, when parsed, then it triggers a build of `after` on that ref,
    for the repository's full_name, by the pusher."""
    payload = load("github_push_branch")
    trigger = as_trigger(github.parse_github("push", DELIVERY, payload))
    assert trigger == GitTrigger(
        source="github",
        event="push",
        repo="Codertocat/Hello-World",
        ref="refs/heads/main",
        commit=payload["after"],
        delivery_id=DELIVERY,
        actor="Codertocat",
    )


def test_github_push_of_a_tag_builds_the_tagged_commit() -> None:
    """Given a push of an annotated tag (after = the tag object, head_commit = the tagged commit), when
    parsed, then it triggers on refs/tags/v1.4.0 and builds the tagged commit, not the tag object."""
    payload = load("github_push_tag")
    assert payload["after"] != payload["head_commit"]["id"]
    trigger = as_trigger(github.parse_github("push", DELIVERY, payload))
    assert trigger.ref == "refs/tags/v1.4.0"
    assert trigger.commit == payload["head_commit"]["id"]
    assert trigger.actor == "release-bot"
    assert trigger.event == "push"


def test_github_push_of_a_tag_without_head_commit_builds_after() -> None:
    """Given a tag push with head_commit null (a lightweight tag, as older deliveries sent it), when
    parsed, then it builds `after`."""
    payload = load("github_push_tag")
    payload["head_commit"] = None
    assert as_trigger(github.parse_github("push", DELIVERY, payload)).commit == payload["after"]


def test_github_branch_deletion_push_is_ignored() -> None:
    """Given the push GitHub sends when a branch is deleted (deleted: true, after all zeros), when
    parsed, then it is ignored as a deletion."""
    result = as_ignored(github.parse_github("push", DELIVERY, load("github_push_branch_deleted")))
    assert result.reason == "refs/heads/feature/old-ui was deleted"


@pytest.mark.parametrize(
    "fields",
    [{"deleted": True}, {"deleted": False, "after": "0" * 40, "head_commit": None}],
    ids=["deleted-flag", "zero-after"],
)
def test_github_push_deletion_by_either_signal_is_ignored(fields: dict[str, Any]) -> None:
    """Given a push marked deleted, or one whose after is all zeros, when parsed, then it is ignored."""
    payload = load("github_push_branch")
    payload.update(fields)
    assert as_ignored(github.parse_github("push", DELIVERY, payload)).reason.endswith("deleted")


def test_github_tag_deletion_push_is_ignored() -> None:
    """Given the push for a deleted tag, when parsed, then it is ignored as a deletion."""
    payload = load("github_push_tag")
    payload.update(before=payload["after"], after="0" * 40, deleted=True, created=False, head_commit=None)
    assert as_ignored(github.parse_github("push", DELIVERY, payload)).reason == "refs/tags/v1.4.0 was deleted"


def test_github_push_to_another_namespace_is_ignored() -> None:
    """Given a push to a ref that is neither a branch nor a tag, when parsed, then it is ignored."""
    payload = load("github_push_branch")
    payload["ref"] = "refs/notes/commits"
    assert "neither a branch nor a tag" in as_ignored(github.parse_github("push", DELIVERY, payload)).reason


def test_github_push_actor_falls_back_to_sender() -> None:
    """Given a push without a pusher, when parsed, then the actor is the sender's login; with neither,
    it is None."""
    payload = load("github_push_branch")
    del payload["pusher"]
    payload["sender"]["login"] = "octocat"
    assert as_trigger(github.parse_github("push", DELIVERY, payload)).actor == "octocat"
    del payload["sender"]
    assert as_trigger(github.parse_github("push", None, payload)).actor is None


def test_github_push_without_delivery_id_still_triggers() -> None:
    """Given no X-GitHub-Delivery header, when parsed, then the trigger carries delivery_id None."""
    assert as_trigger(github.parse_github("push", None, load("github_push_branch"))).delivery_id is None


def test_github_push_accepts_sha256_object_ids() -> None:
    """Given a push from a SHA-256 repository (64-hex ids), when parsed, then it builds that id."""
    payload = load("github_push_branch")
    payload.update(before="1" * 64, after="ab" * 32, head_commit=None)
    assert as_trigger(github.parse_github("push", DELIVERY, payload)).commit == "ab" * 32


def test_push_event_model_keeps_is_deletion() -> None:
    """Given the PushEvent model, when fixtures are read through it, then is_deletion matches them."""
    assert not github.PushEvent.model_validate(load("github_push_branch")).is_deletion
    assert github.PushEvent.model_validate(load("github_push_branch_deleted")).is_deletion


# --------------------------------------------------------------------------------------------
# GitHub: create


def test_github_create_tag_without_commit_is_ignored() -> None:
    """Given GitHub's create event for a tag (which names no commit), when parsed, then it is ignored
    and the reason points at the tag's push event."""
    result = as_ignored(github.parse_github("create", DELIVERY, load("github_create_tag")))
    assert result.reason == (
        "create event for tag v1.4.0 carries no commit; the tag's push event starts the job"
    )


def test_github_create_tag_with_head_commit_is_a_trigger() -> None:
    """Given a create event for a tag that does carry head_commit.id, when parsed, then it triggers on
    refs/tags/<ref> with that commit, by the sender."""
    payload = load("github_create_tag")
    sha = "0d1a26e67d8f5eaf1f6ba5c57fc3c7d91ac0fd1c"
    payload["head_commit"] = {"id": sha, "message": "Release 1.4.0"}
    assert github.parse_github("create", DELIVERY, payload) == GitTrigger(
        source="github",
        event="create",
        repo="Codertocat/Hello-World",
        ref="refs/tags/v1.4.0",
        commit=sha,
        delivery_id=DELIVERY,
        actor="Codertocat",
    )


def test_github_create_branch_is_ignored() -> None:
    """Given a create event for a branch, when parsed, then it is ignored (pushes to it start jobs)."""
    payload = load("github_create_branch")
    payload["head_commit"] = {"id": "a" * 40}
    result = as_ignored(github.parse_github("create", DELIVERY, payload))
    assert result.reason == "create event for branch feature/new-ui does not start jobs"


# --------------------------------------------------------------------------------------------
# GitHub: pull_request


@pytest.mark.parametrize(
    "fixture, sender, fork",
    [
        ("github_pull_request_opened", "Codertocat", None),
        ("github_pull_request_from_fork", "octo-fork", "octo-fork/Hello-World"),
    ],
)
def test_github_pull_request_opened_is_a_trigger(fixture: str, sender: str, fork: str | None) -> None:
    """Given pull_request action opened, from a branch of the base repository or from a fork, when
    parsed, then it triggers on the base repository's refs/pull/2/head with the head sha, by the
    sender, and names the fork whose commits that ref then holds (None for the repository's own
    branch)."""
    payload = load(fixture)
    assert payload["pull_request"]["head"]["repo"]["fork"] is (fork is not None)
    assert github.parse_github("pull_request", DELIVERY, payload) == GitTrigger(
        source="github",
        event="pull_request",
        repo="Codertocat/Hello-World",
        ref="refs/pull/2/head",
        commit=payload["pull_request"]["head"]["sha"],
        delivery_id=DELIVERY,
        actor=sender,
        fork=fork,
    )


def test_github_pull_request_synchronize_from_a_fork_uses_the_base_repository() -> None:
    """Given pull_request synchronize from a fork, when parsed, then repo is the base repository (not
    the fork) and commit is the new head sha."""
    payload = load("github_pull_request_synchronize")
    assert payload["pull_request"]["head"]["repo"]["full_name"] == "octo-fork/Hello-World"
    trigger = as_trigger(github.parse_github("pull_request", DELIVERY, payload))
    assert trigger.repo == "Codertocat/Hello-World"
    assert trigger.ref == "refs/pull/2/head"
    assert trigger.commit == payload["after"] == payload["pull_request"]["head"]["sha"]
    assert trigger.actor == "octo-fork"
    assert trigger.fork == "octo-fork/Hello-World"


def test_github_pull_request_from_the_same_repository_is_not_a_fork() -> None:
    """Given a pull request whose head repository is the base repository spelt in another case,
    when parsed, then fork is None: GitHub names are case-insensitive."""
    payload = load("github_pull_request_opened")
    payload["pull_request"]["head"]["repo"]["full_name"] = "codertocat/hello-world"
    assert as_trigger(github.parse_github("pull_request", DELIVERY, payload)).fork is None


@pytest.mark.parametrize("head_repo", [None, "absent"])
def test_github_pull_request_from_a_deleted_fork_is_a_fork(head_repo: str | None) -> None:
    """Given a pull request whose head repository was deleted (GitHub sends head.repo null), when
    parsed, then it counts as a fork, named "(deleted fork)": nobody can say whose commits it holds."""
    payload = load("github_pull_request_from_fork")
    if head_repo is None:
        payload["pull_request"]["head"]["repo"] = None
    else:
        del payload["pull_request"]["head"]["repo"]
    assert as_trigger(github.parse_github("pull_request", DELIVERY, payload)).fork == "(deleted fork)"


def test_pushes_and_tags_are_never_forks() -> None:
    """Given a branch push and a tag push, when parsed, then neither names a fork."""
    for name in ("github_push_branch", "github_push_tag"):
        assert as_trigger(github.parse_github("push", DELIVERY, load(name))).fork is None


def test_a_fork_pull_request_names_its_number() -> None:
    """Given a pull request trigger, when asked, then it gives N of refs/pull/N/head; a push gives None."""
    assert (
        as_trigger(
            github.parse_github("pull_request", DELIVERY, load("github_pull_request_from_fork"))
        ).pull_request_number
        == "2"
    )
    assert (
        as_trigger(github.parse_github("push", DELIVERY, load("github_push_branch"))).pull_request_number
        is None
    )


def test_github_pull_request_reopened_is_a_trigger() -> None:
    """Given pull_request action reopened, when parsed, then it triggers."""
    payload = load("github_pull_request_opened")
    payload["action"] = "reopened"
    assert as_trigger(github.parse_github("pull_request", DELIVERY, payload)).ref == "refs/pull/2/head"


def test_github_pull_request_closed_is_ignored() -> None:
    """Given pull_request action closed (merged), when parsed, then it is ignored with the action named."""
    result = as_ignored(github.parse_github("pull_request", DELIVERY, load("github_pull_request_closed")))
    assert result.reason == "pull_request action closed does not start jobs"


@pytest.mark.parametrize("action", ["edited", "labeled", "ready_for_review", "converted_to_draft"])
def test_github_other_pull_request_actions_are_ignored(action: str) -> None:
    """Given a pull_request action that does not change the head, when parsed, then it is ignored."""
    payload = load("github_pull_request_opened")
    payload["action"] = action
    assert as_ignored(github.parse_github("pull_request", DELIVERY, payload)).reason == (
        f"pull_request action {action} does not start jobs"
    )


# --------------------------------------------------------------------------------------------
# GitHub: other events


@pytest.mark.parametrize("event", ["issues", "release", "delete", "workflow_run", "check_suite"])
def test_github_other_events_are_ignored_without_validation(event: str) -> None:
    """Given an event Relevo does not build on, with any body, when parsed, then it is ignored by name."""
    assert github.parse_github(event, DELIVERY, {"anything": [1, 2]}) == Ignored(
        f"event {event} does not start jobs"
    )


def test_github_missing_event_name_is_ignored() -> None:
    """Given no X-GitHub-Event header (empty event), when parsed, then it is ignored as (none)."""
    assert github.parse_github("", DELIVERY, {}) == Ignored("event (none) does not start jobs")


# --------------------------------------------------------------------------------------------
# GitHub: malformed payloads


def _without(payload: dict[str, Any], *path: str) -> dict[str, Any]:
    copied = copy.deepcopy(payload)
    target = copied
    for key in path[:-1]:
        target = target[key]
    del target[path[-1]]
    return copied


def _with(payload: dict[str, Any], value: object, *path: str) -> dict[str, Any]:
    copied = copy.deepcopy(payload)
    target = copied
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return copied


GITHUB_MALFORMED = [
    ("push", lambda: _without(load("github_push_branch"), "ref")),
    ("push", lambda: _without(load("github_push_branch"), "after")),
    ("push", lambda: _without(load("github_push_branch"), "repository")),
    ("push", lambda: _without(load("github_push_branch"), "repository", "full_name")),
    ("push", lambda: _with(load("github_push_branch"), None, "repository")),
    ("push", lambda: _with(load("github_push_branch"), 42, "ref")),
    ("push", lambda: _with(load("github_push_branch"), "not-a-sha", "after")),
    ("push", lambda: _with(load("github_push_branch"), "ABCDEF" + "0" * 34, "after")),
    ("push", lambda: _with(load("github_push_branch"), "yes", "deleted")),
    ("push", lambda: _with(load("github_push_branch"), "Codertocat", "pusher")),
    ("push", lambda: _with(load("github_push_branch"), {"id": 5}, "head_commit")),
    ("push", lambda: []),
    ("push", lambda: None),
    ("push", lambda: "refs/heads/main"),
    ("create", lambda: _without(load("github_create_tag"), "ref_type")),
    ("create", lambda: _without(load("github_create_tag"), "ref")),
    ("create", lambda: _with(load("github_create_tag"), "", "ref")),
    ("create", lambda: _with(load("github_create_tag"), {"id": "short"}, "head_commit")),
    ("pull_request", lambda: _without(load("github_pull_request_opened"), "action")),
    ("pull_request", lambda: _without(load("github_pull_request_opened"), "pull_request")),
    ("pull_request", lambda: _without(load("github_pull_request_opened"), "pull_request", "head")),
    ("pull_request", lambda: _without(load("github_pull_request_opened"), "pull_request", "head", "sha")),
    ("pull_request", lambda: _with(load("github_pull_request_opened"), "2", "pull_request", "number")),
    ("pull_request", lambda: _with(load("github_pull_request_opened"), 0, "pull_request", "number")),
    ("pull_request", lambda: _with(load("github_pull_request_opened"), True, "pull_request", "number")),
    ("pull_request", lambda: _with(load("github_pull_request_closed"), None, "repository")),
    (
        "pull_request",
        lambda: _without(load("github_pull_request_from_fork"), "pull_request", "head", "repo", "full_name"),
    ),
    (
        "pull_request",
        lambda: _with(load("github_pull_request_from_fork"), "", "pull_request", "head", "repo", "full_name"),
    ),
    (
        "pull_request",
        lambda: _with(
            load("github_pull_request_from_fork"), "octo-fork/Hello-World", "pull_request", "head", "repo"
        ),
    ),
]


@pytest.mark.parametrize(("event", "make"), GITHUB_MALFORMED)
def test_github_malformed_payloads_raise_validation_error(event: str, make: Any) -> None:
    """Given a body missing a needed key or carrying one of the wrong type, when parsed, then pydantic's
    ValidationError is raised (the caller's 422), never KeyError or TypeError."""
    with pytest.raises(ValidationError):
        github.parse_github(event, DELIVERY, make())


# --------------------------------------------------------------------------------------------
# GitLab: token


def test_gitlab_header_names() -> None:
    """Given the GitLab module, when its header names are read, then they are GitLab's, lower-cased."""
    assert gitlab.TOKEN_HEADER == "x-gitlab-token"
    assert gitlab.EVENT_HEADER == "x-gitlab-event"
    assert gitlab.DELIVERY_HEADER == "x-gitlab-event-uuid"


def test_gitlab_token_matching_the_secret_is_accepted() -> None:
    """Given X-Gitlab-Token equal to the secret, when verified, then it passes."""
    gitlab.verify_token("s3cr3t-t0ken", "s3cr3t-t0ken")


@pytest.mark.parametrize(
    "header",
    ["wrong", "s3cr3t-t0ke", "s3cr3t-t0ken ", " s3cr3t-t0ken", "S3CR3T-T0KEN", "s3cr3t-t0ken\n"],
)
def test_gitlab_wrong_token_is_refused(header: str) -> None:
    """Given a token that is not exactly the secret, when verified, then SIGNATURE_INVALID (401)."""
    with pytest.raises(RelevoError) as caught:
        gitlab.verify_token("s3cr3t-t0ken", header)
    assert caught.value.code is ErrorCode.SIGNATURE_INVALID
    assert caught.value.status == 401


@pytest.mark.parametrize("header", [None, ""])
def test_gitlab_missing_token_is_refused(header: str | None) -> None:
    """Given no X-Gitlab-Token, when verified, then SIGNATURE_INVALID mentioning it is missing."""
    with pytest.raises(RelevoError) as caught:
        gitlab.verify_token("s3cr3t-t0ken", header)
    assert caught.value.code is ErrorCode.SIGNATURE_INVALID
    assert "missing" in caught.value.message


def test_gitlab_token_compares_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Given a spy on hmac.compare_digest, when a token is verified, then the comparison goes through
    compare_digest (not ==), for both a match and a mismatch."""
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)  # verify.py compares through it
    gitlab.verify_token("s3cr3t-t0ken", "s3cr3t-t0ken")
    assert calls == [(b"s3cr3t-t0ken", b"s3cr3t-t0ken")]

    calls.clear()
    with pytest.raises(RelevoError):
        gitlab.verify_token("s3cr3t-t0ken", "guess")
    assert calls == [(b"s3cr3t-t0ken", b"guess")]


# --------------------------------------------------------------------------------------------
# GitLab: events


def test_gitlab_push_hook_is_a_trigger() -> None:
    """Given a GitLab Push Hook to refs/heads/master, when parsed, then it triggers on that ref with
    checkout_sha, for project.path_with_namespace, by user_username."""
    payload = load("gitlab_push_hook")
    assert gitlab.parse_gitlab("Push Hook", DELIVERY, payload) == GitTrigger(
        source="gitlab",
        event="Push Hook",
        repo="mike/diaspora",
        ref="refs/heads/master",
        commit=payload["checkout_sha"],
        delivery_id=DELIVERY,
        actor="jsmith",
    )


def test_gitlab_push_hook_without_checkout_sha_key_builds_after() -> None:
    """Given a Push Hook with no checkout_sha key at all, when parsed, then it builds `after`."""
    payload = load("gitlab_push_hook")
    del payload["checkout_sha"]
    assert as_trigger(gitlab.parse_gitlab("Push Hook", DELIVERY, payload)).commit == payload["after"]


def test_gitlab_tag_push_hook_builds_the_tagged_commit() -> None:
    """Given a Tag Push Hook for an annotated tag (after = tag object, checkout_sha = tagged commit),
    when parsed, then it triggers on refs/tags/v1.0.0 with checkout_sha."""
    payload = load("gitlab_tag_push_hook")
    assert payload["after"] != payload["checkout_sha"]
    assert gitlab.parse_gitlab("Tag Push Hook", DELIVERY, payload) == GitTrigger(
        source="gitlab",
        event="Tag Push Hook",
        repo="jsmith/example",
        ref="refs/tags/v1.0.0",
        commit=payload["checkout_sha"],
        delivery_id=DELIVERY,
        actor="jsmith",
    )


def test_gitlab_branch_deletion_is_ignored() -> None:
    """Given the Push Hook GitLab sends for a deleted branch (after zeros, checkout_sha null), when
    parsed, then it is ignored as a deletion."""
    result = as_ignored(gitlab.parse_gitlab("Push Hook", DELIVERY, load("gitlab_push_hook_branch_deleted")))
    assert result.reason == "refs/heads/feature/old-ui was deleted"


def test_gitlab_tag_deletion_is_ignored() -> None:
    """Given the Tag Push Hook for a deleted tag, when parsed, then it is ignored as a deletion."""
    result = as_ignored(gitlab.parse_gitlab("Tag Push Hook", DELIVERY, load("gitlab_tag_push_hook_deleted")))
    assert result.reason == "refs/tags/v1.0.0 was deleted"


@pytest.mark.parametrize(
    ("event", "name", "fields"),
    [
        ("Push Hook", "gitlab_push_hook", {"checkout_sha": None}),
        ("Push Hook", "gitlab_push_hook", {"after": "0" * 40}),
        ("Tag Push Hook", "gitlab_tag_push_hook", {"checkout_sha": None}),
        ("Tag Push Hook", "gitlab_tag_push_hook", {"after": "0" * 40}),
    ],
)
def test_gitlab_deletion_by_either_signal_is_ignored(event: str, name: str, fields: dict[str, Any]) -> None:
    """Given a push whose after is all zeros, or whose checkout_sha is null, when parsed, then it is
    ignored as a deletion."""
    payload = load(name)
    payload.update(fields)
    assert as_ignored(gitlab.parse_gitlab(event, DELIVERY, payload)).reason.endswith("was deleted")


def test_gitlab_push_hook_for_a_tag_ref_is_ignored() -> None:
    """Given a Push Hook whose ref is a tag (the event and the ref disagree), when parsed, then it is
    ignored rather than built under the wrong kind."""
    payload = load("gitlab_push_hook")
    payload["ref"] = "refs/tags/v1.0.0"
    assert as_ignored(gitlab.parse_gitlab("Push Hook", DELIVERY, payload)).reason == (
        "Push Hook for refs/tags/v1.0.0 is not a branch push"
    )


def test_gitlab_tag_push_hook_for_a_branch_ref_is_ignored() -> None:
    """Given a Tag Push Hook whose ref is a branch, when parsed, then it is ignored."""
    payload = load("gitlab_tag_push_hook")
    payload["ref"] = "refs/heads/master"
    assert as_ignored(gitlab.parse_gitlab("Tag Push Hook", DELIVERY, payload)).reason == (
        "Tag Push Hook for refs/heads/master is not a tag push"
    )


def test_gitlab_push_without_username_has_no_actor() -> None:
    """Given a Push Hook without user_username, when parsed, then the actor is None."""
    payload = load("gitlab_push_hook")
    del payload["user_username"]
    assert as_trigger(gitlab.parse_gitlab("Push Hook", None, payload)).actor is None


@pytest.mark.parametrize("event", ["Merge Request Hook", "Pipeline Hook", "Note Hook", "System Hook", "push"])
def test_gitlab_other_events_are_ignored_without_validation(event: str) -> None:
    """Given a GitLab event Relevo does not build on, with any body, when parsed, then it is ignored."""
    assert gitlab.parse_gitlab(event, DELIVERY, {"object_kind": "whatever"}) == Ignored(
        f"event {event} does not start jobs"
    )


GITLAB_MALFORMED = [
    ("Push Hook", lambda: _without(load("gitlab_push_hook"), "ref")),
    ("Push Hook", lambda: _without(load("gitlab_push_hook"), "after")),
    ("Push Hook", lambda: _without(load("gitlab_push_hook"), "project")),
    ("Push Hook", lambda: _without(load("gitlab_push_hook"), "project", "path_with_namespace")),
    ("Push Hook", lambda: _with(load("gitlab_push_hook"), 15, "project")),
    ("Push Hook", lambda: _with(load("gitlab_push_hook"), 4, "user_username")),
    ("Push Hook", lambda: _with(load("gitlab_push_hook"), "da15608", "checkout_sha")),
    ("Push Hook", lambda: _with(load("gitlab_push_hook"), ["refs/heads/master"], "ref")),
    ("Push Hook", lambda: []),
    ("Tag Push Hook", lambda: _without(load("gitlab_tag_push_hook"), "after")),
    ("Tag Push Hook", lambda: _with(load("gitlab_tag_push_hook"), None, "project")),
    ("Tag Push Hook", lambda: None),
]


@pytest.mark.parametrize(("event", "make"), GITLAB_MALFORMED)
def test_gitlab_malformed_payloads_raise_validation_error(event: str, make: Any) -> None:
    """Given a GitLab push body missing a needed key or carrying one of the wrong type, when parsed,
    then pydantic's ValidationError is raised, never KeyError or TypeError."""
    with pytest.raises(ValidationError):
        gitlab.parse_gitlab(event, DELIVERY, make())
