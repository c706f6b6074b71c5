"""A job's transition as a commit status: GitHub's or GitLab's request, or none.

GitHub: "Create a commit status" (REST, docs.github.com/en/rest/commits/statuses), POST
/repos/{owner}/{repo}/statuses/{sha} with `state` pending | success | failure | error, `context`
relevo/<project>, `target_url`, `description`. A status is kept per context, so each
transition overwrites the last and a repeat is harmless.

GitLab: "Set the pipeline status of a commit" (REST, docs.gitlab.com/api/commits/), POST
/projects/:id/statuses/:sha with `state` pending | running | success | failed | canceled,
`name`, `ref`, `target_url`, `description`, authenticated by the PRIVATE-TOKEN header. GitLab's
status is a state machine that refuses a transition to where it already is, or back from
running to pending (400 "Cannot transition status via :enqueue from :running"), so a gate and
the run after it report nothing there: GitLab shows `running` throughout.

A job that read test reports says their counts in the description at its end ("tests: 5 passed
(1 flaky), 1 failed"), and the failed tests' ids where they fit: GitLab's commit status has no
annotations (its fields are state, ref, name, target_url, description, coverage and
pipeline_id), and a GitHub App's check run annotates each failure besides (notify.github_app).
"""

from __future__ import annotations

from urllib.parse import quote

from relevo_core.models.project_settings import CommitStatusSettings
from relevo_core.models.status import JobStatus
from relevo_core.notify.sending import OutgoingRequest
from relevo_core.notify.transitions import APPROVAL_TIMEOUT, REJECTED, JobTransition, tests_words

GITHUB_API_VERSION = "2022-11-28"
# GitHub keeps the first 140 characters of a description.
DESCRIPTION_LIMIT = 140
# Failures that are Relevo's or the fleet's, not the commit's: GitHub's `error`.
_NOT_THE_COMMITS_FAULT = ("Relevo.Timeout.Queue", "Relevo.Lease.", "Relevo.Agent.", "States.")


def describe(transition: JobTransition) -> str:
    status = transition.status
    if status is JobStatus.HELD:
        text = f"held ({transition.held_reason}): relevo job release {transition.job_id}"
    elif status is JobStatus.WAITING:
        text = f"waiting for approval of {transition.stage}: relevo job approve {transition.job_id}"
    elif transition.error_name == REJECTED:
        text = f"rejected at the approval of {transition.stage}"
    elif transition.error_name == APPROVAL_TIMEOUT:
        text = f"the approval of {transition.stage} timed out"
    elif status is JobStatus.FAILED:
        text = f"failed: {transition.error_name or 'unknown error'}"
    elif status is JobStatus.SUCCEEDED and transition.warning_stages:
        # Still a success (GitHub's `success`): the description says what to look at.
        text = f"succeeded, with warnings in {', '.join(transition.warning_stages)}"
    else:
        text = status.value
    if transition.tests is not None:
        text += f"; tests: {tests_words(transition.tests)}"
    if transition.released:
        # What the people who ship look for first: "uploaded build 42 (VALID)", "notarized (Accepted, …)".
        text += "; " + "; ".join(words for _stage, words in transition.released)
    if transition.reconciled:
        # "Did it upload twice?": a reconciled stage says what its probe found, and that it was not run again.
        text += "; " + "; ".join(transition.reconciled)
    text += _failed_names(transition.failed_tests, DESCRIPTION_LIMIT - len(text))
    # Cut to the limit, saying so (GitHub refuses a longer one with 422; GitLab is given the same).
    return text if len(text) <= DESCRIPTION_LIMIT else text[: DESCRIPTION_LIMIT - 1] + "…"


def _failed_names(names: tuple[str, ...], room: int) -> str:
    """`; failed: a, b` with as many of the failed tests' ids as fit in `room` characters (`, …`
    when some did not); nothing when not even the first fits."""
    said = ""
    for index, name in enumerate(names):
        more = ", …" if index + 1 < len(names) else ""
        candidate = f"; failed: {name}" if not said else f"{said}, {name}"
        if len(candidate + more) > room:
            return f"{said}, …" if said else ""
        said = candidate
    return said


def github_state(transition: JobTransition) -> str:
    status = transition.status
    if status is JobStatus.SUCCEEDED:
        return "success"
    if status is JobStatus.CANCELED:
        return "error"
    if status is JobStatus.FAILED:
        name = transition.error_name or ""
        return "error" if name.startswith(_NOT_THE_COMMITS_FAULT) else "failure"
    return "pending"


def gitlab_state(transition: JobTransition) -> str | None:
    status = transition.status
    if status in (JobStatus.QUEUED, JobStatus.HELD):
        return "pending"
    if status in (JobStatus.RUNNING, JobStatus.DISPATCHED):
        # Already running there since before the gate: GitLab refuses running → running.
        return None if transition.previous is JobStatus.WAITING else "running"
    if status is JobStatus.WAITING:
        return None
    return {JobStatus.SUCCEEDED: "success", JobStatus.FAILED: "failed", JobStatus.CANCELED: "canceled"}[
        status
    ]


def short_ref(ref: str) -> str:
    """GitLab's `ref` is a branch or tag name, not a full ref."""
    for prefix in ("refs/heads/", "refs/tags/"):
        if ref.startswith(prefix):
            return ref[len(prefix) :]
    return ref


def wants_report(transition: JobTransition, settings: CommitStatusSettings) -> bool:
    """Whether the provider is told of this transition at all (before any secret is read)."""
    if not transition.commit:
        return False
    return settings.provider == "github" or gitlab_state(transition) is not None


def status_request(
    transition: JobTransition, settings: CommitStatusSettings, repo: str, token: str, link: str
) -> OutgoingRequest | None:
    """The request reporting `transition`, or None when the provider has nothing to be told."""
    if not wants_report(transition, settings):
        return None
    if settings.provider == "github":
        owner, name = repo.split("/", 1)
        path = f"/repos/{quote(owner, safe='')}/{quote(name, safe='')}/statuses/{transition.commit}"
        return OutgoingRequest(
            target="github_status",
            method="POST",
            url=settings.base_url() + path,
            shown_url=settings.base_url() + path,
            body={
                "state": github_state(transition),
                "target_url": link,
                "description": describe(transition),
                "context": f"relevo/{transition.project}",
            },
            headers={
                "Accept": "application/vnd.github+json",
                "Authorization": f"Bearer {token}",
                "X-GitHub-Api-Version": GITHUB_API_VERSION,
            },
        )
    state = gitlab_state(transition)
    project = quote(settings.gitlab_project or repo, safe="")
    path = f"/projects/{project}/statuses/{transition.commit}"
    return OutgoingRequest(
        target="gitlab_status",
        method="POST",
        url=settings.base_url() + path,
        shown_url=settings.base_url() + path,
        body={
            "state": state,
            "ref": short_ref(transition.ref),
            "name": f"relevo/{transition.project}",
            "target_url": link,
            "description": describe(transition),
        },
        headers={"PRIVATE-TOKEN": token},
    )
