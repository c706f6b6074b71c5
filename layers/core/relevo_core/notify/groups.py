"""Group channels: which notices a change stands for, and their delivery to each channel of the
project's group (Slack incoming webhook, email through the group topic's SNS subscriptions).

- job_waiting: once on entering a gate (marker `job_waiting#<stage>`), and once for its outcome
  (approved, rejected, timed out: `job_waiting#<stage>#outcome`). A job ended by its gate gets no
  job_failed: its ending was already told as the gate's outcome.
- job_failed, job_succeeded (opt-in): once per job (`ended`).
- key_frozen: once per freeze of an idempotency key.
- agents_offline: when the last online agent of a region goes offline, at most once per
  AGENTS_OFFLINE_WINDOW_SEC per group and region ("only on change": a flapping agent pages once).
  Heard two ways, one window for both: an agent's clean stop (its record's `online: false`), and
  the sweeper's record of the region's change from some agent online to none (store.region_online),
  which is how an agent killed, frozen or cut off is heard.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

from relevo_core.aws import client
from relevo_core.models.delivery import Outcome
from relevo_core.models.group import Group, GroupEvent
from relevo_core.models.project import Project
from relevo_core.models.status import JobStatus
from relevo_core.notify.messages import Notice, email_message, slack_message
from relevo_core.notify.outbound import Outbound
from relevo_core.notify.report import Report, transition_report
from relevo_core.notify.sending import OutgoingRequest
from relevo_core.notify.transitions import APPROVAL_TIMEOUT, REJECTED, JobTransition, tests_words
from relevo_core.store import agents
from relevo_core.store.keys import FREEZE_SK, REGION_ONLINE_SK
from relevo_core.store.notices import finish_notice, open_window

AGENTS_OFFLINE_WINDOW_SEC = 600


def _reason(cause: str | None) -> str | None:
    if not cause:
        return None
    try:
        parsed = json.loads(cause)
    except ValueError:
        return cause[:500]
    if isinstance(parsed, dict):
        return str(parsed.get("reason") or parsed.get("cause") or parsed.get("error") or cause)[:500]
    return cause[:500]


def job_notices(transition: JobTransition, link: str) -> list[tuple[Notice, str]]:
    """The notices one job transition stands for, each with the key of its marker."""
    t = transition
    common: dict[str, Any] = {
        "project": t.project,
        "job_id": t.job_id,
        "ref": t.ref,
        "actor": t.actor,
        "link": link,
        "commit": t.commit,
        # Where each release effect stands ("upload: uploaded build 42 (VALID)"), then the reconciliations.
        "notes": (*(f"{stage}: {words}" for stage, words in t.released), *t.reconciled),
        "build_number": t.build_number,
        # The job's tests counted (passed, failed, flaky, skipped), when its stages read reports.
        "tests": tests_words(t.tests) if t.tests is not None else None,
    }
    if t.status is JobStatus.WAITING:
        return [
            (
                Notice(
                    GroupEvent.JOB_WAITING,
                    f"{t.project}: {t.stage} waits for approval",
                    stage=t.stage,
                    command=f"relevo job approve {t.job_id}",
                    **common,
                ),
                f"job_waiting#{t.stage}",
            )
        ]
    # An approval sends nothing: the job goes on, and one message per gate is what a release
    # manager asked for. A reject or a timeout ends the job at the gate: that ending is told under
    # job_waiting, once, and no job_failed follows it.
    if t.ended_at_gate:
        gate = t.gate or t.stage
        outcome = "rejected" if t.error_name == REJECTED else "timed out waiting for approval"
        reason = _reason(t.error_cause) if t.error_name == REJECTED else None
        return [
            (
                Notice(
                    GroupEvent.JOB_WAITING,
                    f"{t.project}: {gate} {outcome}",
                    stage=gate,
                    reason=reason,
                    command=f"relevo job rerun {t.job_id} --from-stage {gate}"
                    if t.error_name == APPROVAL_TIMEOUT
                    else None,
                    **common,
                ),
                f"job_waiting#{gate}#outcome",
            )
        ]
    if t.status is JobStatus.FAILED:
        reason = (
            t.error_name + (f": {_reason(t.error_cause)}" if t.error_cause else "") if t.error_name else None
        )
        return [
            (
                Notice(
                    GroupEvent.JOB_FAILED,
                    f"{t.project}: job failed",
                    stage=t.stage,
                    reason=reason,
                    command=f"relevo job rerun {t.job_id}" + (f" --from-stage {t.stage}" if t.stage else ""),
                    **common,
                ),
                "ended",
            )
        ]
    if t.status is JobStatus.SUCCEEDED:
        return [(Notice(GroupEvent.JOB_SUCCEEDED, f"{t.project}: job succeeded", **common), "ended")]
    return []


def channel_target(group: Group, index: int) -> str:
    channel = group.channels[index]
    return f"{channel.kind}:{group.name}:{index}"


def notify_job(outbound: Outbound, transition: JobTransition, project: Project, deadline: float) -> None:
    group = outbound.group(project.group) if project.group else None
    if group is None:
        return
    for notice, key in job_notices(transition, outbound.link(transition, project)):
        if notice.event not in group.events:
            continue
        for index in range(len(group.channels)):
            report = transition_report(
                transition, channel_target(group, index), key=key, event=notice.event.value
            )
            if outbound.claim(report):
                send_to_channel(outbound, group, index, notice, report, deadline)


def send_to_channel(
    outbound: Outbound,
    group: Group,
    index: int,
    notice: Notice,
    report: Report,
    deadline: float,
    claimed: bool = True,
) -> None:
    channel = group.channels[index]
    if channel.kind == "slack":
        assert channel.webhook_secret_ref is not None  # the group model requires it of a Slack channel
        try:
            url = outbound.secret(channel.webhook_secret_ref)
        except Exception as exc:  # an unreadable secret: dead-lettered, never raised
            outbound.give_up(
                report,
                None,
                f"the secret {channel.webhook_secret_ref} cannot be read ({type(exc).__name__})",
                claimed=claimed,
            )
            return
        # The webhook URL is the secret: what is shown of it is its host.
        shown = f"{urlsplit(url).scheme}://{urlsplit(url).netloc}/… ({channel.webhook_secret_ref})"
        request = OutgoingRequest("slack", "POST", url, slack_message(notice), shown_url=shown)
        outbound.deliver(report, request, deadline, claimed=claimed)
    elif channel.kind == "email":
        publish_email(outbound, group, notice, report, claimed)


def publish_email(outbound: Outbound, group: Group, notice: Notice, report: Report, claimed: bool) -> None:
    subject, body = email_message(notice)
    began = outbound.clock.now()
    try:
        # One topic for every group: each address's subscription filters on the group attribute.
        client("sns").publish(
            TopicArn=outbound.settings.group_topic_arn,
            Subject=subject,
            Message=body,
            MessageAttributes={"group": {"DataType": "String", "StringValue": group.name}},
        )
    except Exception as exc:  # SNS refused (throttled, key unusable): dead-lettered, never raised
        outbound.give_up(report, None, f"SNS publish failed ({type(exc).__name__})", claimed=claimed)
        return
    ended = outbound.clock.now()
    outbound.record(report, Outcome.DELIVERED, 1, None, int((ended - began) * 1000), None, ended)
    if claimed:
        finish_notice(outbound.settings.table_name, report.subject, report.target, report.key, "sent")


def notify_other_change(
    outbound: Outbound,
    old: dict[str, Any] | None,
    new: dict[str, Any] | None,
    deadline: float,
    projects: Callable[[], list[Project]],
) -> None:
    """key_frozen (a freeze record's new freeze) and agents_offline (an agent's clean stop, or
    the sweeper's record of the region's change to none online, left it without an online agent)."""
    if not new:
        return
    if (
        new.get("sk") == FREEZE_SK
        and new.get("frozen_at")
        and new.get("frozen_at") != (old or {}).get("frozen_at")
    ):
        project = outbound.project(str(new.get("project")))
        group = outbound.group(project.group) if project and project.group else None
        if project is None or group is None or GroupEvent.KEY_FROZEN not in group.events:
            return
        key_id = str(new.get("pk", "")).removeprefix("FREEZE#")
        notice = Notice(
            GroupEvent.KEY_FROZEN,
            f"{project.id}: automatic runs of a key are frozen",
            project=project.id,
            reason=f"the idempotency key {key_id} kept dead-lettering",
            command=f"relevo dlq unfreeze {key_id}",
        )
        for index in range(len(group.channels)):
            report = Report(
                f"key_frozen#{key_id}",
                channel_target(group, index),
                str(new["frozen_at"]),
                "key_frozen",
                project.id,
                None,
                {"idempotency_key": key_id, "frozen_at": new["frozen_at"]},
            )
            if outbound.claim(report):
                send_to_channel(outbound, group, index, notice, report, deadline)
        return
    pk = str(new.get("pk", ""))
    if not pk.startswith("AGENTS#") or new.get("online") is not False:
        return
    if new.get("sk") == REGION_ONLINE_SK:
        # Only a change from some agent online: a region's first record (no agent yet) is none.
        if (old or {}).get("online") is not True:
            return
        reason = "no agent of the region wrote its presence within its timeout (killed, frozen or cut off)"
    elif (old or {}).get("online") is not False:
        reason = f"the last online agent, {new.get('agent_id')}, stopped"
    else:
        return
    notify_agents_offline(
        outbound, pk.removeprefix("AGENTS#"), reason, new.get("agent_id"), deadline, projects
    )


def notify_agents_offline(
    outbound: Outbound,
    region: str,
    reason: str,
    agent_id: str | None,
    deadline: float,
    projects: Callable[[], list[Project]],
) -> None:
    """Each group with a project in `region` is paged, unless an agent is online again or the
    group was paged for the region less than AGENTS_OFFLINE_WINDOW_SEC ago."""
    now = outbound.clock.now()
    if agents.online_agents(outbound.settings.table_name, region, datetime.fromtimestamp(now, UTC)):
        return
    groups = sorted({p.group for p in projects() if p.region_affinity == region and p.group})
    for name in groups:
        group = outbound.group(name)
        if group is None or GroupEvent.AGENTS_OFFLINE not in group.events:
            continue
        if not open_window(
            outbound.settings.table_name,
            f"agents_offline#{name}#{region}",
            int(now),
            AGENTS_OFFLINE_WINDOW_SEC,
        ):
            continue  # paged less than the window ago: only on change
        notice = Notice(
            GroupEvent.AGENTS_OFFLINE,
            f"no agent online in {region}",
            region=region,
            reason=reason,
            command="relevo agent list",
        )
        for index in range(len(group.channels)):
            report = Report(
                f"agents_offline#{region}",
                channel_target(group, index),
                str(int(now)),
                "agents_offline",
                f"group:{name}",
                None,
                {"region": region, "agent_id": agent_id},
            )
            send_to_channel(outbound, group, index, notice, report, deadline, claimed=False)
