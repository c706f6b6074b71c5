"""What invokes the stack's functions besides its API, where the emulator keeps the source but never
invokes Lambda from it: DynamoDB streams, the schedules of EventBridge rules and those of
EventBridge Scheduler (project schedules). Each runs on threads of its own until `stopping` is set.
"""

from __future__ import annotations

import sys
import threading
import time
import uuid
from functools import partial
from pathlib import Path
from typing import Any

from relevo_local import identity, template
from relevo_local import moto as moto_patches
from relevo_local.lambda_runtime import FunctionRuntime
from relevo_local.scheduler import ScheduleFirer
from relevo_local.streams import StreamConsumer, StreamPoller, record_filter

ACCOUNT_ID = identity.ACCOUNT_ID


class EventSources:
    """The event sources of the stack deployed from `root`, invoking its functions' `runtimes` (by
    logical id)."""

    def __init__(
        self,
        root: Path,
        runtimes: dict[str, FunctionRuntime],
        stopping: threading.Event,
        region: str,
        stack_name: str,
    ) -> None:
        self.root = root
        self._runtimes = runtimes
        self._stopping = stopping
        self.region = region
        self.stack_name = stack_name

    def start_streams(
        self, dynamodb: Any, streams: Any, sam: dict[str, Any], physical: dict[str, str | None]
    ) -> list[StreamPoller]:
        """DynamoDB stream events: a poller per function and stream (see local/streams.py), each
        started; `dynamodb` and `streams` are the emulator's clients."""
        by_stream: dict[str, StreamPoller] = {}  # one reader per stream, every function's source on it
        for fn in template.sam_functions(sam, self.root):
            for event_name, table_id, batch_size, patterns in fn.streams:
                table = dynamodb.describe_table(TableName=str(physical[table_id]))["Table"]
                moto_patches.dynamodb.detach_emulator_stream_invoker(
                    table["TableName"], ACCOUNT_ID, self.region
                )
                consumer = StreamConsumer(
                    f"{fn.logical_id}-{event_name}",
                    batch_size,
                    invoke=partial(self._invoke, fn.logical_id),
                    keep=record_filter(patterns),
                )
                arn = table["LatestStreamArn"]
                if arn in by_stream:
                    by_stream[arn].add_consumer(consumer)
                else:
                    by_stream[arn] = StreamPoller.reading_for(streams, arn, consumer)
        for poller in by_stream.values():
            poller.start(self._stopping)
        return list(by_stream.values())

    def start_schedules(self, sam: dict[str, Any]) -> None:
        """EventBridge rules from `Schedule` events: the emulator keeps the rule but cannot invoke
        Lambda, so a timer per rule invokes the function with the scheduled event AWS sends."""
        for fn in template.sam_functions(sam, self.root):
            for event_name, period in fn.schedules:
                thread = threading.Thread(
                    target=self._tick,
                    args=(fn.logical_id, event_name, period),
                    daemon=True,
                    name=f"schedule-{event_name}",
                )
                thread.start()

    def _tick(self, function: str, event_name: str, period: float) -> None:
        while not self._stopping.wait(period):
            event = {
                "version": "0",
                "id": str(uuid.uuid4()),
                "detail-type": "Scheduled Event",
                "source": "aws.events",
                "account": ACCOUNT_ID,
                "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "region": self.region,
                "resources": [
                    f"arn:aws:events:{self.region}:{ACCOUNT_ID}:rule/{self.stack_name}-{function}{event_name}"
                ],
                "detail": {},
            }
            try:
                self._runtimes[function].invoke(event)
            except Exception as exc:  # an asynchronous invoke's failure is only logged
                sys.stderr.write(f"scheduled {function}/{event_name} failed: {exc}\n")

    def start_project_schedules(
        self, scheduler: Any, groups: list[str], poll_sec: float
    ) -> ScheduleFirer | None:
        """EventBridge Scheduler schedules (project schedules): the emulator stores them but never
        fires them, so a thread polls the stack's schedule groups every `poll_sec` and fires each
        due rate(...) schedule at its target. cron(...) schedules are not fired locally."""
        if not groups:
            return None
        firer = ScheduleFirer(scheduler, groups, self._invoke_arn)
        threading.Thread(
            target=firer.run,
            args=(self._stopping, poll_sec),
            daemon=True,
            name="project-schedules",
        ).start()
        return firer

    def _invoke(self, function: str, event: dict[str, Any]) -> Any:
        return self._runtimes[function].invoke(event)

    def _invoke_arn(self, arn: str, event: dict[str, Any]) -> Any:
        """Invoke the stack's function whose ARN (or a qualified ARN of it) is `arn`."""
        for runtime in self._runtimes.values():
            if arn == runtime.arn or arn.startswith(runtime.arn + ":"):
                return runtime.invoke(event)
        raise LookupError(f"no function of this stack has the ARN {arn}")
