"""What a group's channels are told, and how each channel shows it.

Slack: an incoming-webhook message in Block Kit, kept within Slack's published limits ("Blocks"
reference, docs.slack.dev/reference/block-kit/blocks: at most 50 blocks; a header's plain text
150 characters; a section's text 3000 and at most 10 fields of 2000 each; a context at most 10
elements; a button's text 75 and its url 3000). Email: an SNS publish (Subject at most 100
ASCII characters without line breaks, "Publish" in the SNS API Reference).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from relevo_core.models.group import GroupEvent

SLACK_LIMITS = {
    "blocks": 50,
    "header": 150,
    "section": 3000,
    "fields": 10,
    "field": 2000,
    "context": 10,
    "button": 75,
    "url": 3000,
}
SUBJECT_LIMIT = 100


@dataclass(frozen=True)
class Notice:
    event: GroupEvent
    title: str  # one line: what happened
    project: str | None = None
    job_id: str | None = None
    ref: str | None = None
    stage: str | None = None
    actor: str | None = None
    reason: str | None = None
    link: str | None = None
    command: str | None = None  # what a person runs next, e.g. `relevo job approve JOB`
    region: str | None = None
    # The commit the job builds (its trigger's, or the one its first checkout resolved).
    commit: str | None = None
    # What else a person must know, a line each: a stage reconciled rather than run again.
    notes: tuple[str, ...] = ()
    # The job's build number (RELEVO_BUILD_NUMBER), once it has one.
    build_number: int | None = None
    # At the job's end, when its stages read test reports: `5 passed (1 flaky), 1 failed`.
    tests: str | None = None

    def facts(self) -> list[tuple[str, str]]:
        named = [
            ("Project", self.project),
            ("Job", self.job_id),
            ("Ref", self.ref),
            ("Commit", self.commit[:12] if self.commit else None),
            ("Build number", str(self.build_number) if self.build_number is not None else None),
            ("Stage", self.stage),
            ("Tests", self.tests),
            ("Actor", self.actor),
            ("Region", self.region),
        ]
        return [(name, value) for name, value in named if value]


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _mrkdwn_escape(text: str) -> str:
    # Slack's mrkdwn reads &, < and > as markup ("Formatting text for app surfaces": escaping).
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack_message(notice: Notice) -> dict[str, Any]:
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": _cut(notice.title, SLACK_LIMITS["header"])}}
    ]
    fields = [
        {"type": "mrkdwn", "text": _cut(f"*{name}*\n{_mrkdwn_escape(value)}", SLACK_LIMITS["field"])}
        for name, value in notice.facts()[: SLACK_LIMITS["fields"]]
    ]
    if fields:
        blocks.append({"type": "section", "fields": fields})
    if notice.reason:
        blocks.append(
            {
                "type": "section",
                "text": {
                    "type": "mrkdwn",
                    "text": _cut(f"*Reason*\n{_mrkdwn_escape(notice.reason)}", SLACK_LIMITS["section"]),
                },
            }
        )
    if notice.notes:
        noted = "\n".join(_mrkdwn_escape(line) for line in notice.notes)
        blocks.append(
            {"type": "section", "text": {"type": "mrkdwn", "text": _cut(noted, SLACK_LIMITS["section"])}}
        )
    if notice.command:
        blocks.append(
            {
                "type": "section",
                "text": {"type": "mrkdwn", "text": _cut(f"`{notice.command}`", SLACK_LIMITS["section"])},
            }
        )
    if notice.link and len(notice.link) <= SLACK_LIMITS["url"]:
        blocks.append(
            {
                "type": "actions",
                "elements": [
                    {
                        "type": "button",
                        "text": {"type": "plain_text", "text": "Open the job" if notice.job_id else "Open"},
                        "url": notice.link,
                    }
                ],
            }
        )
    blocks.append(
        {"type": "context", "elements": [{"type": "mrkdwn", "text": f"relevo · {notice.event.value}"}]}
    )
    # `text` is the notification's own line (and what clients without blocks show).
    return {"text": _cut(notice.title, SLACK_LIMITS["section"]), "blocks": blocks[: SLACK_LIMITS["blocks"]]}


def email_message(notice: Notice) -> tuple[str, str]:
    subject = " ".join(f"Relevo: {notice.title}".split())
    subject = subject.encode("ascii", "replace").decode("ascii")
    lines = [notice.title, ""] + [f"{name}: {value}" for name, value in notice.facts()]
    if notice.reason:
        lines += ["", f"Reason: {notice.reason}"]
    if notice.notes:
        lines += ["", *notice.notes]
    if notice.command:
        lines += ["", f"Run: {notice.command}"]
    if notice.link:
        lines += ["", notice.link]
    return _cut(subject, SUBJECT_LIMIT), "\n".join(lines)
