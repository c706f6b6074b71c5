"""The faults the field reports, armed per test on the local Apple service, each for a number of
requests then gone:

- `lose_answer(operation)`: the request takes effect (the upload's commit, the submission), then
  the connection closes with no answer at all -- the client cannot tell whether it went through;
- `gateway_timeout(operation)`: the request takes effect, then a 504 from the edge (fastlane#12060);
- `redundant_binary_in_processing()`: the next second upload of a version and build number is
  accepted and fails in processing with ITMS-90189, as Transporter reports it, instead of the
  API's 409 at creation;
- `hold_in_progress(minutes)`: the next notarization stays In Progress that long after its upload;
- `roll_history(count)`: that many newer submissions, so an earlier one falls out of the 100 the
  history answers;
- `on_commit(operation, callback)`: a hook, not a fault of Apple's: `callback` runs once the request
  has taken effect and before its answer is sent (the drill kills the agent there: the upload's
  bytes went through, its answer never reached the client).

Operations are named by the description's operationId (`buildUploadsCreateInstance`,
`buildUploadFilesUpdateInstance`, ...) or the Notary API's endpoint (`submitSoftware`,
`getSubmissionStatus`, `getPreviousSubmissions`, `getSubmissionLog`)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Literal

from relevo_local.apple.connect_state import ConnectState
from relevo_local.apple.notary import NotaryState

AfterCommit = Literal["lose_answer", "gateway_timeout"]


class Faults:
    def __init__(self, connect: ConnectState, notary: NotaryState) -> None:
        self._connect = connect
        self._notary = notary
        self._after: dict[str, list[AfterCommit]] = {}
        self._lock = threading.Lock()
        self.fired: list[tuple[str, AfterCommit]] = []
        self._hooks: dict[str, list[Callable[[], None]]] = {}

    def lose_answer(self, operation: str, times: int = 1) -> None:
        with self._lock:
            self._after.setdefault(operation, []).extend(["lose_answer"] * times)

    def gateway_timeout(self, operation: str, times: int = 1) -> None:
        with self._lock:
            self._after.setdefault(operation, []).extend(["gateway_timeout"] * times)

    def redundant_binary_in_processing(self, times: int = 1) -> None:
        with self._connect.lock:
            self._connect.redundant_fails_in_processing += times

    def hold_in_progress(self, minutes: float) -> None:
        with self._notary.lock:
            self._notary.next_holds_sec.append(minutes * 60)

    def roll_history(self, count: int) -> None:
        self._notary.add_past(count)

    def on_commit(self, operation: str, callback: Callable[[], None]) -> None:
        """`callback` run once, on the service's thread, when `operation` next takes effect."""
        with self._lock:
            self._hooks.setdefault(operation, []).append(callback)

    def clear_hooks(self) -> None:
        with self._lock:
            self._hooks.clear()

    def run_hook(self, operation: str) -> None:
        """The hook armed for this operation, used up (run outside the lock: it may take time)."""
        with self._lock:
            armed = self._hooks.get(operation)
            callback = armed.pop(0) if armed else None
        if callback is not None:
            callback()

    def take(self, operation: str) -> AfterCommit | None:
        """The fault armed for this operation's answer, used up."""
        with self._lock:
            armed = self._after.get(operation)
            if not armed:
                return None
            fault = armed.pop(0)
            self.fired.append((operation, fault))
            return fault
