"""One thing to tell one target, and the marker that makes it once."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from relevo_core.notify.transitions import JobTransition


@dataclass(frozen=True)
class Report:
    """One thing to tell one target: `subject` and `key` name its marker (a job id and its
    transition, a frozen key and its freeze, ...); `event` is what its delivery records say."""

    subject: str
    target: str
    key: str
    event: str
    project: str
    job_id: str | None
    detail: dict[str, Any] = field(default_factory=dict)


def transition_report(
    transition: JobTransition, target: str, key: str | None = None, event: str | None = None
) -> Report:
    return Report(
        subject=transition.job_id,
        target=target,
        key=key or transition.key,
        event=event or transition.key.split("#")[0],
        project=transition.project,
        job_id=transition.job_id,
        detail=transition.as_event(),
    )
