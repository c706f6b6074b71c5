"""GitHub App mode: Check Runs instead of commit statuses, with a summary per stage.

Authentication ("Authenticating as a GitHub App installation", docs.github.com/en/apps/
creating-github-apps/authenticating-with-a-github-app): a JWT signed RS256 with the App's private
key (`iss` the App id, `iat` 60 s in the past against clock drift, `exp` at most 10 minutes
ahead), exchanged by POST /app/installations/{installation_id}/access_tokens for an installation
token (valid one hour, reused here until five minutes before it expires).

A job's first report creates its check run (POST /repos/{owner}/{repo}/check-runs, `external_id`
the job id); each later one updates it (PATCH /repos/{owner}/{repo}/check-runs/{check_run_id}).

At the job's end its failed tests are annotations of the run, at the file and line their report
gave (a failure without a file is listed in the output's text instead). GitHub takes at most 50
annotations a request and appends those of each update to the run's ("Update a check run",
docs.github.com/en/rest/checks/runs: "The Checks API limits the number of annotations to a
maximum of 50 per API request. To create more than 50 annotations, you have to make multiple
requests to the Update a check run endpoint"): the ending request carries the first 50, one
update each the next (annotation_requests).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import jwt

from relevo_core.models.project_settings import CommitStatusSettings, GitHubAppSettings
from relevo_core.models.status import JobStatus
from relevo_core.notify.commit_status import GITHUB_API_VERSION, describe
from relevo_core.notify.sending import Clock, OutgoingRequest, SendPolicy, Transport, send
from relevo_core.notify.transitions import APPROVAL_TIMEOUT, JobTransition

JWT_LIFETIME_SEC = 540  # under GitHub's 10-minute maximum, with room for clock drift
TOKEN_REUSE_MARGIN_SEC = 300
SUMMARY_LIMIT = 65_535  # GitHub: output.summary, "Maximum length: 65535 characters"
TEXT_LIMIT = 65_535  # GitHub: output.text, the same
ANNOTATIONS_PER_REQUEST = 50
# The failures a job's run annotates at most (20 requests); the rest are counted in its text.
MAX_ANNOTATIONS = 1_000
ANNOTATION_TITLE_LIMIT = 255


def app_jwt(app: GitHubAppSettings, private_key: str, now: float) -> str:
    issued = int(now) - 60
    return jwt.encode(
        {"iat": issued, "exp": issued + JWT_LIFETIME_SEC, "iss": str(app.app_id)},
        private_key,
        algorithm="RS256",
    )


def _headers(bearer: str) -> dict[str, str]:
    return {
        "Accept": "application/vnd.github+json",
        "Authorization": f"Bearer {bearer}",
        "X-GitHub-Api-Version": GITHUB_API_VERSION,
    }


class TokenUnavailable(Exception):
    pass


@dataclass
class InstallationTokens:
    """Installation tokens, fetched when needed and reused while they last (per warm function)."""

    transport: Transport
    clock: Clock
    secret: Callable[[str], str]
    _cache: dict[tuple[str, int], tuple[str, float]] = field(default_factory=dict)

    def token(self, settings: CommitStatusSettings, policy: SendPolicy, deadline: float) -> str:
        app = settings.app
        assert app is not None
        cache_key = (settings.base_url(), app.installation_id)
        cached = self._cache.get(cache_key)
        if cached and cached[1] - TOKEN_REUSE_MARGIN_SEC > self.clock.now():
            return cached[0]
        bearer = app_jwt(app, self.secret(app.private_key_ref), self.clock.now())
        url = f"{settings.base_url()}/app/installations/{app.installation_id}/access_tokens"
        request = OutgoingRequest(
            "github_app_token", "POST", url, {}, headers=_headers(bearer), shown_url=url
        )
        result = send(request, policy, self.transport, self.clock, deadline)
        if not result.delivered:
            raise TokenUnavailable(result.reason or "no installation token")
        answer = json.loads(result.body or b"{}")
        expires = datetime.fromisoformat(str(answer["expires_at"]).replace("Z", "+00:00")).timestamp()
        self._cache[cache_key] = (str(answer["token"]), expires)
        return str(answer["token"])


def check_run_state(transition: JobTransition) -> dict[str, Any]:
    status = transition.status
    if status in (JobStatus.QUEUED, JobStatus.HELD):
        return {"status": "queued"}
    if not status.terminal:
        return {"status": "in_progress"}
    if status is JobStatus.SUCCEEDED:
        conclusion = "success"
    elif status is JobStatus.CANCELED:
        conclusion = "cancelled"
    elif transition.error_name == APPROVAL_TIMEOUT:
        conclusion = "timed_out"
    else:
        conclusion = "failure"
    return {"status": "completed", "conclusion": conclusion}


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(int(seconds), 60)
    return f"{minutes}m {rest:02d}s" if minutes < 60 else f"{minutes // 60}h {minutes % 60:02d}m"


def _moment(value: Any) -> datetime | None:
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")) if value else None
    except ValueError:
        return None


def stage_summary(
    heading: str, plan: list[str], stages: list[dict[str, Any]], now: float, rejected_at: str | None = None
) -> str:
    """Every stage of the job's plan with its status and duration: ended − started, or how long
    it has run so far (as of `now`); a stage not dispatched yet is pending."""
    by_index = {int(str(stage.get("sk", "")).removeprefix("STAGE#") or -1): stage for stage in stages}
    lines = [
        f"**{heading}**",
        "",
        "| stage | status | duration | attempt | error |",
        "| --- | --- | --- | --- | --- |",
    ]
    for index, name in enumerate(
        plan or [str(stage.get("stage_name") or stage.get("sk")) for stage in stages]
    ):
        stage = by_index.get(index, {})
        started, ended = _moment(stage.get("started_at")), _moment(stage.get("ended_at"))
        if started and ended:
            duration = _duration(max(0.0, (ended - started).total_seconds()))
        elif started:
            duration = f"{_duration(max(0.0, now - started.timestamp()))} so far"
        else:
            duration = ""
        lines.append(
            f"| {name} | {stage.get('status', 'pending')} | {duration} | {stage.get('attempt', '')} | "
            f"{stage.get('error_class') or ''} |"
        )
    if rejected_at:
        lines += ["", f"Rejected at the approval of {rejected_at}."]
    return "\n".join(lines)[:SUMMARY_LIMIT]


def failure_annotations(failures: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str]:
    """(the annotations of a job's failed tests, rows of GET /jobs/{id}/tests: those with a file,
    at its line or at line 1 without one; the output's text: the failures without a file, and
    those past MAX_ANNOTATIONS, by id with where they ran)."""
    annotations: list[dict[str, Any]] = []
    unplaced: list[str] = []
    for test in failures:
        where = test["stage"] if test.get("shard") is None else f"{test['stage']}[{test['shard']}]"
        ran = f"{test['id']} ({test['status']}, {where} on {test.get('agent_id') or 'an unknown Mac'})"
        if not test.get("file") or len(annotations) >= MAX_ANNOTATIONS:
            unplaced.append(
                f"- `{ran}`" + (f": {test['message'].splitlines()[0]}" if test.get("message") else "")
            )
            continue
        line = test.get("line") or 1
        annotations.append(
            {
                "path": test["file"],
                "start_line": line,
                "end_line": line,
                "annotation_level": "failure",
                "title": test["id"][:ANNOTATION_TITLE_LIMIT],
                "message": test.get("message") or f"{test['status']}",
                "raw_details": ran,
            }
        )
    text = ""
    if unplaced:
        text = "\n".join(
            ["**Failed tests not annotated** (no file in their report, or past the limit)", "", *unplaced]
        )
    return annotations, text[:TEXT_LIMIT]


def annotation_requests(
    transition: JobTransition,
    settings: CommitStatusSettings,
    repo: str,
    token: str,
    run_id: int,
    summary: str,
    annotations: list[dict[str, Any]],
) -> list[OutgoingRequest]:
    """The updates that add the annotations past the first ANNOTATIONS_PER_REQUEST (which the
    ending request carries), 50 each: output only, as a stage's update."""
    requests = []
    for start in range(ANNOTATIONS_PER_REQUEST, len(annotations), ANNOTATIONS_PER_REQUEST):
        update = check_run_output_request(transition, settings, repo, token, run_id, summary)
        update.body["output"]["annotations"] = annotations[start : start + ANNOTATIONS_PER_REQUEST]
        requests.append(update)
    return requests


def check_run_output_request(
    transition: JobTransition,
    settings: CommitStatusSettings,
    repo: str,
    token: str,
    run_id: int,
    summary: str,
) -> OutgoingRequest:
    """A stage started or ended: the run's output only. Its status and conclusion stay as the
    job's own reports set them, so an update that arrives late cannot reopen a completed run."""
    owner, name = repo.split("/", 1)
    url = f"{settings.base_url()}/repos/{quote(owner, safe='')}/{quote(name, safe='')}/check-runs/{run_id}"
    body = {"output": {"title": describe(transition), "summary": summary}}
    return OutgoingRequest("github_check_run", "PATCH", url, body, headers=_headers(token), shown_url=url)


def check_run_request(
    transition: JobTransition,
    settings: CommitStatusSettings,
    repo: str,
    token: str,
    link: str,
    run_id: int | None,
    summary: str,
    now: float,
    annotations: list[dict[str, Any]] | None = None,
    text: str = "",
) -> OutgoingRequest:
    """The job's report as its run: created by the first, updated by each later one; at the
    end with the first 50 of its failures' annotations and the text of the others."""
    owner, name = repo.split("/", 1)
    base = f"{settings.base_url()}/repos/{quote(owner, safe='')}/{quote(name, safe='')}/check-runs"
    body: dict[str, Any] = {
        **check_run_state(transition),
        "details_url": link,
        "output": {"title": describe(transition), "summary": summary},
    }
    if annotations:
        body["output"]["annotations"] = annotations[:ANNOTATIONS_PER_REQUEST]
    if text:
        body["output"]["text"] = text
    if body["status"] == "completed":
        body["completed_at"] = datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    if run_id is None:
        body = {
            "name": f"relevo/{transition.project}",
            "head_sha": transition.commit,
            "external_id": transition.job_id,
            **body,
        }
        url, method = base, "POST"
    else:
        url, method = f"{base}/{run_id}", "PATCH"
    return OutgoingRequest("github_check_run", method, url, body, headers=_headers(token), shown_url=url)
