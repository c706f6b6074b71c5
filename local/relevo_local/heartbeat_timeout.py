"""Emulator patch: a heartbeat lapse is reported as States.HeartbeatTimeout, as AWS names it.

moto 5.2.5's Step Functions interpreter raises HeartbeatTimeoutError when a callback task's
HeartbeatSeconds pass without SendTaskHeartbeat, but reports it as States.Timeout (the same
failure as a TimeoutSeconds lapse), so a Catch on States.HeartbeatTimeout never matches there.
AWS reports the lapse as States.HeartbeatTimeout ("Error handling in Step Functions", error
names), and job.asl.json tells a lost lease from an exec timeout by exactly that name: the
AwaitResult Catch on States.HeartbeatTimeout comes before the one on States.Timeout, and AWS
scans catchers in order. tests/integration/test_timeout_classification.py checks both.
"""

from __future__ import annotations

from typing import Any

_PATCHED = "_relevo_heartbeat_timeout_named"


def name_heartbeat_timeouts() -> None:
    """Idempotent: patch moto's callback tasks once per process."""
    from moto.stepfunctions.parser.api import HistoryEventType, TaskTimedOutEventDetails
    from moto.stepfunctions.parser.asl.component.common.error_name.failure_event import FailureEvent
    from moto.stepfunctions.parser.asl.component.common.error_name.states_error_name import StatesErrorName
    from moto.stepfunctions.parser.asl.component.common.error_name.states_error_name_type import StatesErrorNameType
    from moto.stepfunctions.parser.asl.component.state.exec.state_task.service.state_task_service_callback import (
        StateTaskServiceCallback,
    )
    from moto.stepfunctions.parser.asl.eval.callback.callback import HeartbeatTimeoutError
    from moto.stepfunctions.parser.asl.eval.event.event_detail import EventDetails

    if getattr(StateTaskServiceCallback, _PATCHED, False):
        return
    original = StateTaskServiceCallback._from_error

    def _from_error(self: Any, env: Any, ex: Exception) -> Any:
        if not isinstance(ex, HeartbeatTimeoutError):
            return original(self, env, ex)
        name = StatesErrorNameType.StatesHeartbeatTimeout
        return FailureEvent(
            env=env,
            error_name=StatesErrorName(typ=name),
            event_type=HistoryEventType.TaskTimedOut,
            event_details=EventDetails(
                taskTimedOutEventDetails=TaskTimedOutEventDetails(
                    resourceType=self._get_sfn_resource_type(),
                    resource=self._get_sfn_resource(),
                    error=name.to_name(),
                )
            ),
        )

    StateTaskServiceCallback._from_error = _from_error  # type: ignore[method-assign]
    setattr(StateTaskServiceCallback, _PATCHED, True)
