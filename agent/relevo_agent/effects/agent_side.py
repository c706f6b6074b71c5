"""What the agent gives a stage's built-in effect for one attempt (relevo_agent.effects.kind's
EffectContext): the file resolved inside the workspace, the release keys read with the job's
session, the attempt's clock and stop, and its values' path (journal first, then the stage
record); and the probe's answer as the reconcile table reads it (relevo_agent.reconcile).

A release key never leaves the agent's memory: the kind gets it from `secret`, and every line or
value the effect leaves passes a mask of the key's text first (its lines too: a PEM is many).
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from botocore.exceptions import ClientError

from relevo_agent.effects.kind import Answer, EffectContext, EffectFailed, Endpoints, ProbeAnswer
from relevo_agent.logs import Masker
from relevo_agent.reconcile import PROBE_ABSENT, PROBE_IN_PROGRESS, PROBE_PRESENT, ProbeResult
from relevo_core.aws import call_budget, client, error_code
from relevo_core.models.effect import RELEASE_SECRET
from relevo_core.models.errors import ErrorClass

log = logging.getLogger(__name__)

# A probe that cannot tell: any exit but 0, 1 and 118 (relevo_agent.reconcile).
PROBE_CANNOT_TELL = 2
_EXITS = {
    Answer.DONE: PROBE_PRESENT,
    Answer.ABSENT: PROBE_ABSENT,
    Answer.IN_PROGRESS: PROBE_IN_PROGRESS,
    Answer.CANNOT_TELL: PROBE_CANNOT_TELL,
}
# Secrets Manager's answers that no retry changes: the key is missing or not this job's to read.
_KEY_REFUSED = frozenset({"ResourceNotFoundException", "AccessDeniedException", "InvalidRequestException"})
# Lines of a secret's text shorter than this are not masked on their own (a PEM's "-----" lines).
_MASKED_LINE_CHARS = 16


class FileProblem(Exception):
    def __init__(self, error_class: ErrorClass, message: str) -> None:
        super().__init__(message)
        self.error_class = error_class
        self.message = message


def effect_file(workspace: Path, relative: str) -> Path:
    """The effect's file in the workspace, never through a link that leads out of it. Raises
    FileProblem: HandoffMissing when no such file is there (the earlier stage that hands it on did
    not, or the checkout has none), HandoffPath when it resolves outside the workspace."""
    root = workspace.resolve()
    path = workspace / relative
    if not os.path.lexists(path):
        raise FileProblem(
            ErrorClass.HANDOFF_MISSING,
            f"effect: {relative} is not in the workspace: the earlier stage that hands it on did not "
            "(or the checkout has no such file)",
        )
    resolved = path.resolve()
    if not resolved.is_relative_to(root):
        raise FileProblem(
            ErrorClass.HANDOFF_PATH,
            f"effect: {relative} leads out of the workspace (a symlink): only a file inside it is sent",
        )
    if not resolved.is_file():
        raise FileProblem(ErrorClass.HANDOFF_MISSING, f"effect: {relative} is not a file")
    return resolved


def key_object(name: str, text: str) -> dict[str, Any]:
    """A release key's text (its SecretString) as the JSON object every kind reads; EFFECT_REFUSED
    naming the key (never its text) when it is not one."""
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        raise EffectFailed(ErrorClass.EFFECT_REFUSED, f"the key {name} is not a JSON object")
    return parsed


class ReleaseKeys:
    """The project's release keys as the effect reads them: with the job's session (the stage
    thread's job scope, relevo_core.aws), under relevo/<stack>/_release/<project>/ only. Their text
    is kept for the mask."""

    def __init__(self, project: str) -> None:
        self.project = project
        self._texts: list[str] = []
        self._lock = threading.Lock()

    def read(self, name: str) -> dict[str, Any]:
        if not re.match(RELEASE_SECRET, name) or name.split("/")[3] != self.project:
            # The job's session could not read it either (template.yaml, JobPolicy): said plainly.
            raise EffectFailed(
                ErrorClass.EFFECT_REFUSED,
                f"the key {name} is not under relevo/<stack>/_release/{self.project}/: a stage reads its own "
                "project's release keys only",
            )
        try:
            with call_budget(10.0):
                answer = client("secretsmanager").get_secret_value(SecretId=name)
        except Exception as exc:  # noqa: BLE001 - the stage fails saying why, never with the secret
            code = error_code(exc) if isinstance(exc, ClientError) else type(exc).__name__
            error = ErrorClass.EFFECT_REFUSED if code in _KEY_REFUSED else ErrorClass.CONNECTION_RESET
            raise EffectFailed(error, f"the key {name} could not be read ({code})") from None
        text = answer.get("SecretString") or ""
        self._keep(text)
        parsed = key_object(name, text)
        for value in parsed.values():
            if isinstance(value, str):
                self._keep(value)
        return parsed

    def _keep(self, text: str) -> None:
        pieces = [text, *(line.strip() for line in text.splitlines())]
        with self._lock:
            self._texts.extend(piece for piece in pieces if len(piece) >= _MASKED_LINE_CHARS)

    def masker(self, others: Masker) -> Callable[[str], str]:
        """A mask of the keys read so far, after `others` (the agent's `mask` values)."""

        def mask(text: str) -> str:
            with self._lock:
                texts = list(self._texts)
            return Masker(texts).mask(others.mask(text)) if texts else others.mask(text)

        return mask


def effect_context(
    *,
    operation_id: str,
    workspace: Path,
    file: Path,
    build_number: int | None,
    endpoints: Endpoints,
    record: Callable[[dict[str, str]], None],
    line: Callable[[str], None],
    keys: ReleaseKeys,
    time_left: Callable[[], float],
    stop: threading.Event,
    now: Callable[[], float] = time.time,
) -> EffectContext:
    """`stop`: the attempt's cancel event; a wait ends early, saying so, once it is set."""
    return EffectContext(
        operation_id=operation_id,
        workspace=workspace,
        file=file,
        build_number=build_number,
        endpoints=endpoints,
        record=record,
        line=line,
        secret=keys.read,
        time_left=time_left,
        wait=lambda seconds: stop.wait(max(0.0, seconds)),
        now=now,
    )


def probe_result(found: ProbeAnswer, operation_id: str, mask: Callable[[str], str]) -> ProbeResult:
    """A kind's answer as the reconcile table reads a probe's exit and output. The kind decided
    whose the effect is (the same sha256, a name carrying the operation id): its DONE and
    IN_PROGRESS name the operation; the evidence, masked, is what is kept."""
    evidence = mask(found.evidence)
    output = evidence
    if found.answer in (Answer.DONE, Answer.IN_PROGRESS):
        output = f"{evidence} (operation {operation_id})"
    return ProbeResult(_EXITS[found.answer], output, output[-1024:])


def values_to_string(values: dict[str, Any]) -> dict[str, str]:
    """A kind's values as the stage keeps them: strings, by lowercase key."""
    return {str(key): str(value) for key, value in values.items()}
