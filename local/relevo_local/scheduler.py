"""EventBridge Scheduler on the local stack: the emulator stores schedules but never fires them.

`ScheduleFirer.poll` lists the schedules of the stack's schedule group(s) through the Scheduler
API and fires each `rate(...)` schedule when due, the first time one period after this firer
first saw it, invoking the target with its Input and Scheduler's context attributes filled in.

cron(...) schedules are not fired locally (they are stored, and run in AWS): working out cron
slots would need a cron engine, and a local stack rarely lives until a cron slot comes anyway.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from relevo_local.template import rate_seconds


@dataclass
class _Timer:
    expression: str
    period: float
    next_due: float


def scheduled_time(epoch: float) -> str:
    """What `<aws.scheduler.scheduled-time>` becomes: ISO 8601, whole seconds, UTC (Z)."""
    return datetime.fromtimestamp(int(epoch), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def fill_context(template: str, schedule_arn: str, due: float) -> str:
    """Scheduler's context attributes as it substitutes them into a target's Input."""
    return (
        template.replace("<aws.scheduler.scheduled-time>", scheduled_time(due))
        .replace("<aws.scheduler.schedule-arn>", schedule_arn)
        .replace("<aws.scheduler.execution-id>", str(uuid.uuid4()))
        .replace("<aws.scheduler.attempt-number>", "1")
    )


class ScheduleFirer:
    def __init__(
        self,
        scheduler: Any,
        groups: list[str],
        invoke: Callable[[str, dict[str, Any]], Any],
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`invoke(target_arn, event)` runs the target; `clock` gives epoch seconds."""
        self.scheduler = scheduler
        self.groups = list(groups)
        self.invoke = invoke
        self.clock = clock
        self._timers: dict[str, _Timer] = {}
        self._not_fired: set[str] = set()

    def _schedules(self) -> list[dict[str, Any]]:
        found = []
        for group in self.groups:
            kwargs: dict[str, Any] = {"GroupName": group}
            while True:
                page = self.scheduler.list_schedules(**kwargs)
                found.extend(page.get("Schedules", []))
                if not page.get("NextToken"):
                    break
                kwargs["NextToken"] = page["NextToken"]
        return found

    def poll(self) -> list[tuple[str, str]]:
        """One pass: fire every due slot; returns (schedule name, scheduled time) of each fired."""
        now = self.clock()
        fired: list[tuple[str, str]] = []
        seen = set()
        for summary in self._schedules():
            arn = summary["Arn"]
            seen.add(arn)
            if summary.get("State", "ENABLED") != "ENABLED":
                self._timers.pop(arn, None)
                continue
            # ListSchedules leaves out the expression and the target's Input.
            schedule = self.scheduler.get_schedule(Name=summary["Name"], GroupName=summary["GroupName"])
            expression = schedule["ScheduleExpression"]
            try:
                period = rate_seconds(expression)
            except ValueError:
                if arn not in self._not_fired:  # cron(...) / at(...): not fired locally
                    self._not_fired.add(arn)
                    sys.stderr.write(
                        f"schedule {summary['Name']}: {expression} is not fired on the local stack\n"
                    )
                self._timers.pop(arn, None)
                continue
            timer = self._timers.get(arn)
            if timer is None or timer.expression != expression:
                self._timers[arn] = _Timer(expression, period, now + period)
                continue
            while timer.next_due <= now:
                due = timer.next_due
                timer.next_due += timer.period
                target = schedule["Target"]
                event = json.loads(fill_context(target.get("Input", "{}"), arn, due))
                try:
                    self.invoke(target["Arn"], event)
                except Exception as exc:  # Scheduler's invoke is asynchronous: a failure is only logged
                    sys.stderr.write(f"schedule {summary['Name']} at {scheduled_time(due)} failed: {exc}\n")
                fired.append((summary["Name"], scheduled_time(due)))
        for arn in set(self._timers) - seen:
            del self._timers[arn]
        return fired

    def run(self, stopping: threading.Event, interval: float) -> None:
        while not stopping.wait(interval):
            try:
                self.poll()
            except Exception as exc:  # the emulator going away at shutdown, mostly
                if not stopping.is_set():
                    sys.stderr.write(f"schedule poll failed: {exc}\n")
