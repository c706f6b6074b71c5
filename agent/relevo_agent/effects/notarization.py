"""The `notarization` kind: a .zip, .dmg or .pkg submitted to Apple's Notary API once, waited for,
then stapled.

What it records, in order, each before the next step can have happened:
    sha256, submission_name   before Submit Software: the name carries the file's sha256 and the
                              operation id, so the history finds the submission if its id is lost
    submission_id             the moment Apple answers (and a log line shows it)
    uploaded                  once the file is in the submission's S3 object

The probe (read only) asks Apple by the recorded id, else looks for the name in the history (the
team's 100 most recent submissions), and answers:
    Accepted                          DONE (the values as perform leaves them), or IN_PROGRESS when
                                      the file is to be stapled and `stapler validate` finds no
                                      ticket on it: resume staples it
    In Progress, its file uploaded    IN_PROGRESS: resume waits for it, never submits again
    In Progress, upload not recorded  CANNOT_TELL: if the file never reached it (the submission's
                                      answer was lost, so were its upload credentials) Apple will
                                      never finish it, and waiting would only time out again
    Invalid / Rejected                CANNOT_TELL, with Apple's state and log in the evidence: the
                                      submission happened and was turned down. DONE would succeed a
                                      rejected stage, ABSENT would submit the same file again, and
                                      the contract has no "done, failed": a person resolves it as
                                      failed (`relevo job resolve`), never a silent second submission
    a name found that is not ours,    CANNOT_TELL
    or the id's name not the recorded
    no id, name not in a history      ABSENT: nothing was submitted
    of fewer than 100
    no id, name not in a full history CANNOT_TELL: it may have rolled out of the 100
    network error, 401, a 5xx         CANNOT_TELL

Stapling (`stapler validate`, then `stapler staple` when not yet stapled: both harmless again) runs
through the command this agent is given (`xcrun stapler` on macOS); an agent without one refuses a
stapled notarization before submitting anything. A .zip cannot be stapled; the log says so.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from botocore.exceptions import ClientError

from relevo_agent.effects.apple_token import bearer_token, team_key
from relevo_agent.effects.kind import Answer, EffectContext, EffectFailed, ProbeAnswer
from relevo_agent.effects.notary_client import (
    HISTORY_SIZE,
    NotaryClient,
    NotaryRefused,
    NotaryUnreachable,
    Submission,
)
from relevo_agent.effects.stapling import STAPLEABLE, Stapler, StaplerDidNotRun
from relevo_core.models.effect import Notarization
from relevo_core.models.errors import ErrorClass

# What Apple's notary service takes (notarytool's accepted formats).
SUBMITTABLE = (".zip", ".dmg", ".pkg")
IN_PROGRESS = "In Progress"
ACCEPTED = "Accepted"
TURNED_DOWN = ("Invalid", "Rejected")
# A file name's stem kept in the submission's name: enough to recognise it, short enough that the
# name (stem, 16 hex of the sha256, the operation id, the extension) stays a file name (< 255).
STEM_CHARS = 64
READ_CHUNK = 1 << 20
LOG_ISSUES_SHOWN = 10
# Secrets Manager's answers for a secret that is not there or not the job's to read.
SECRET_REFUSALS = {"ResourceNotFoundException", "AccessDeniedException", "DecryptionFailure"}


def submission_name(file: Path, sha256: str, operation_id: str) -> str:
    """`<stem>.<sha256[:16]>.<job id>.<stage>[.shard-N]<ext>`: Apple asks for the uploaded file's
    name with its extension (Submit Software); the rest ties the submission to this file and this
    operation. The operation id's `:` and `#` become `.` (neither a job id nor a stage has one)."""
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", file.stem)[:STEM_CHARS] or "file"
    operation = operation_id.replace(":", ".").replace("#", ".")
    return f"{stem}.{sha256[:16]}.{operation}{file.suffix.lower()}"


def file_sha256(file: Path) -> str:
    digest = hashlib.sha256()
    with file.open("rb") as stream:
        while chunk := stream.read(READ_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


class NotarizationEffect:
    def __init__(
        self,
        spec: Notarization,
        stapler: Sequence[str] | None = None,
        upload_endpoint: str | None = None,
        poll_sec: float = 15,
        stapler_timeout_sec: float = 120,
    ) -> None:
        """`stapler`: the command that staples (default `xcrun stapler` on macOS, none elsewhere);
        `upload_endpoint`: where submissions' files go (default Apple's S3; the local service's
        stand-in in tests and the demo)."""
        self.spec = spec
        self.stapler = Stapler.for_agent(stapler, stapler_timeout_sec)
        self.upload_endpoint = upload_endpoint
        self.poll_sec = poll_sec

    # -- perform -----------------------------------------------------------------------------

    def perform(self, context: EffectContext) -> dict[str, str]:
        file = self._submittable(context)
        staples = self._staples(file, context)
        client = self._client(context)
        sha256 = file_sha256(file)
        name = submission_name(file, sha256, context.operation_id)
        context.record({"sha256": sha256, "submission_name": name})
        try:
            target = client.submit(sha256, name)
        except NotaryRefused as refusal:
            raise EffectFailed(ErrorClass.EFFECT_REFUSED, _refused("the submission", refusal)) from refusal
        except NotaryUnreachable as error:
            # It may have gone through: the retry's probe finds it by its name in the history.
            raise EffectFailed(
                ErrorClass.CONNECTION_RESET,
                f"notarization: no answer to the submission of {name} ({error}); a retry looks for it "
                "by name in Apple's history before submitting anything",
            ) from error
        context.record({"submission_id": target.submission_id})
        context.line(f"notarization: submission {target.submission_id} made for {file.name} ({name})")
        try:
            client.upload(target, file)
        except NotaryUnreachable as error:
            raise EffectFailed(
                ErrorClass.CONNECTION_RESET,
                f"notarization: the file did not reach submission {target.submission_id} ({error}); "
                "Apple will not finish it, and a retry will not submit again on its own",
            ) from error
        context.record({"uploaded": "true"})
        context.line(f"notarization: {file.name} uploaded to submission {target.submission_id}")
        return self._wait(context, client, target.submission_id, name, sha256, file, staples)

    # -- probe -------------------------------------------------------------------------------

    def probe(self, context: EffectContext, recorded: Mapping[str, str]) -> ProbeAnswer:
        try:
            client = self._client(context)
            name, sha256 = self._identity(context, recorded)
            found = self._find(client, recorded, name)
        except EffectFailed as failed:  # the key or the file: nothing to ask Apple with
            return ProbeAnswer(Answer.CANNOT_TELL, f"notarization: cannot probe: {failed.message}")
        except (NotaryUnreachable, OSError) as error:
            return ProbeAnswer(Answer.CANNOT_TELL, f"notarization: Apple could not be asked: {error}")
        except NotaryRefused as refusal:
            return ProbeAnswer(Answer.CANNOT_TELL, f"notarization: {_refused('the probe', refusal)}")
        if isinstance(found, ProbeAnswer):
            return found
        values = _values(found, sha256)
        if found.status == ACCEPTED:
            return self._accepted(context, found, name, values)
        if found.status == IN_PROGRESS:
            if recorded.get("uploaded") == "true":
                return ProbeAnswer(
                    Answer.IN_PROGRESS, f"notarization: submission {found.id} ({name}) In Progress", values
                )
            return ProbeAnswer(
                Answer.CANNOT_TELL,
                f"notarization: submission {found.id} ({name}) is In Progress, but no attempt recorded "
                "its file uploaded: if the file never reached it Apple will never finish it. Resolve the "
                "stage by hand (waiting or failing it); nothing is submitted again",
                values,
            )
        if found.status in TURNED_DOWN:
            issues = _issues(_log_or_note(client, found.id))
            return ProbeAnswer(
                Answer.CANNOT_TELL,
                f"notarization: submission {found.id} ({name}) was {found.status}: {issues}. It happened and "
                "was turned down: resolve the stage as failed; a new job submits a fixed file",
                values,
            )
        return ProbeAnswer(
            Answer.CANNOT_TELL, f"notarization: submission {found.id} has status {found.status!r}"
        )

    def _accepted(
        self, context: EffectContext, found: Submission, name: str, values: dict[str, str]
    ) -> ProbeAnswer:
        """Accepted is done once the ticket is stapled where it should be: `stapler validate` (read
        only) says whether the file carries it; if not, the effect is finished by resume (which
        staples), never by a second submission."""
        file = context.file
        staples = (
            self.spec.staple
            and file.suffix.lower() in STAPLEABLE
            and self.stapler is not None
            and file.is_file()
        )
        if not staples:
            accepted = f"notarization: submission {found.id} ({name}) Accepted"
            return ProbeAnswer(Answer.DONE, accepted, {**values, "stapled": "false"})
        assert self.stapler is not None  # in `staples`
        try:
            carries = self.stapler.carries_ticket(file, context.time_left)
        except StaplerDidNotRun as error:
            return ProbeAnswer(Answer.CANNOT_TELL, f"notarization: {error}", values)
        if not carries:
            return ProbeAnswer(
                Answer.IN_PROGRESS,
                f"notarization: submission {found.id} ({name}) Accepted; its ticket is not yet stapled to "
                f"{file.name}: resume staples it",
                values,
            )
        return ProbeAnswer(
            Answer.DONE,
            f"notarization: submission {found.id} ({name}) Accepted, its ticket stapled to {file.name}",
            {**values, "stapled": "true"},
        )

    def _find(self, client: NotaryClient, recorded: Mapping[str, str], name: str) -> Submission | ProbeAnswer:
        submission_id = recorded.get("submission_id")
        if submission_id:
            try:
                found = client.status(submission_id)
            except NotaryRefused as refusal:
                if refusal.status != 404:
                    raise
                return ProbeAnswer(
                    Answer.CANNOT_TELL, f"notarization: Apple knows no submission {submission_id} (recorded)"
                )
            if found.name != name:
                return ProbeAnswer(
                    Answer.CANNOT_TELL,
                    f"notarization: submission {submission_id} is named {found.name!r}, not {name!r}",
                )
            return found
        history = client.history()
        named = [submission for submission in history if submission.name == name]
        if len(named) > 1:
            ids = ", ".join(s.id for s in named)
            return ProbeAnswer(
                Answer.CANNOT_TELL, f"notarization: {len(named)} submissions named {name}: {ids}"
            )
        if named:
            return named[0]
        if len(history) >= HISTORY_SIZE:
            return ProbeAnswer(
                Answer.CANNOT_TELL,
                f"notarization: {name} is not among Apple's {len(history)} most recent submissions, and "
                "that history is full: it may have rolled out of it",
            )
        return ProbeAnswer(
            Answer.ABSENT,
            f"notarization: no submission {name} among Apple's {len(history)} most recent (all of them)",
        )

    # -- resume ------------------------------------------------------------------------------

    def resume(self, context: EffectContext, recorded: Mapping[str, str]) -> dict[str, str]:
        client = self._client(context)
        file = self._submittable(context)
        staples = self._staples(file, context)
        name, sha256 = self._identity(context, recorded)
        try:
            found = self._find(client, recorded, name)
        except NotaryRefused as refusal:
            raise EffectFailed(ErrorClass.EFFECT_REFUSED, _refused("the resume", refusal)) from refusal
        except NotaryUnreachable as error:
            raise EffectFailed(
                ErrorClass.CONNECTION_RESET, f"notarization: Apple could not be asked: {error}"
            ) from error
        if isinstance(found, ProbeAnswer):
            # Nothing to wait for that is provably this operation's: never submit from here.
            raise EffectFailed(ErrorClass.MANUAL_REVIEW, f"{found.evidence}; nothing is submitted on resume")
        if found.status == IN_PROGRESS and recorded.get("uploaded") != "true":
            raise EffectFailed(
                ErrorClass.MANUAL_REVIEW,
                f"notarization: submission {found.id} is In Progress and no attempt recorded its file "
                "uploaded: Apple may never finish it; nothing is submitted on resume",
            )
        if found.id != recorded.get("submission_id"):
            context.record({"submission_id": found.id})
        context.line(f"notarization: waiting for submission {found.id} ({name})")
        return self._wait(context, client, found.id, name, sha256, file, staples)

    # -- the steps ---------------------------------------------------------------------------

    def _wait(
        self,
        context: EffectContext,
        client: NotaryClient,
        submission_id: str,
        name: str,
        sha256: str,
        file: Path,
        staples: bool,
    ) -> dict[str, str]:
        """Poll until Apple decides. A failed poll is never read as a decision: it is retried until
        the stage's time is up (a dropped status poll once read as a rejection shipped nothing)."""
        shown = ""
        trouble = ""
        while True:
            try:
                submission = client.status(submission_id)
            except (NotaryUnreachable, NotaryRefused) as error:
                if not trouble:
                    context.line(
                        f"notarization: submission {submission_id}'s status not read ({error}); asking again"
                    )
                trouble = str(error)
            else:
                trouble = ""
                if submission.status != shown:
                    # Each change of Apple's status, as it happens: in the stage's log and on the stage.
                    context.line(f"notarization: submission {submission_id} is {submission.status}")
                    context.record({"apple_state": submission.status})
                    shown = submission.status
                if submission.status == ACCEPTED:
                    values = _values(submission, sha256)
                    values["stapled"] = "true" if staples and self._staple(context, file) else "false"
                    return values
                if submission.status in TURNED_DOWN:
                    raise self._turned_down(context, client, submission)
            if context.time_left() < self.poll_sec:
                break
            if context.wait(self.poll_sec):
                raise EffectFailed(
                    ErrorClass.AGENT_SHUTDOWN,
                    f"notarization: stopped while waiting for submission {submission_id}; a retry resumes "
                    "waiting for it",
                )
        why = f" (its status last read: {trouble})" if trouble else ""
        # Retryable: the retry probes, finds the submission in progress and resumes it.
        raise EffectFailed(
            ErrorClass.NETWORK_TIMEOUT,
            f"notarization: submission {submission_id} not decided within the stage's time{why}; a retry "
            "resumes waiting for it and never submits again",
        )

    def _turned_down(
        self, context: EffectContext, client: NotaryClient, submission: Submission
    ) -> EffectFailed:
        log = _log_or_note(client, submission.id)
        issues = _issues(log)
        context.line(f"notarization: submission {submission.id} {submission.status}: {issues}")
        context.record({"apple_state": submission.status})
        return EffectFailed(
            ErrorClass.EFFECT_REJECTED,
            f"notarization: Apple found submission {submission.id} ({submission.name}) {submission.status}: "
            f"{issues}",
        )

    def _staple(self, context: EffectContext, file: Path) -> bool:
        assert self.stapler is not None  # checked before anything was submitted
        try:
            if self.stapler.carries_ticket(file, context.time_left):
                context.line(f"notarization: {file.name} already carries its ticket")
                return True
            code, output = self.stapler.staple(file, context.time_left)
        except StaplerDidNotRun as error:
            raise EffectFailed(ErrorClass.COMMAND_FAILED, f"notarization: {error}") from error
        if code != 0:
            # Often Apple's ticket not yet published: the retry's probe finds the submission Accepted
            # and the file without its ticket, and resume staples it (never a second submission).
            raise EffectFailed(
                ErrorClass.TRANSIENT_EXIT,
                f"notarization: Apple accepted the file but `stapler staple {file.name}` failed "
                f"(exit {code}): {output}; a retry staples it again",
            )
        context.line(f"notarization: ticket stapled to {file.name}")
        return True

    def _staples(self, file: Path, context: EffectContext) -> bool:
        """Whether the file gets its ticket stapled; refused up front (nothing submitted) when it
        should and this agent has no stapler."""
        if not self.spec.staple:
            return False
        if file.suffix.lower() not in STAPLEABLE:
            context.line(
                f"notarization: {file.name} is a {file.suffix} file: a ticket cannot be stapled to it"
            )
            return False
        if self.stapler is None:
            raise EffectFailed(
                ErrorClass.EFFECT_REFUSED,
                f"notarization: {file.name} is to be stapled, and this agent has no stapler (not macOS, no "
                "`stapler` in its config): run the stage on a Mac, or declare staple: false",
            )
        return True

    def _submittable(self, context: EffectContext) -> Path:
        file = context.file
        if file.suffix.lower() not in SUBMITTABLE:
            raise EffectFailed(
                ErrorClass.EFFECT_REFUSED,
                f"notarization: {self.spec.file} is not a .zip, .dmg or .pkg "
                "(what Apple's notary service takes)",
            )
        if not file.is_file():
            raise EffectFailed(
                ErrorClass.EFFECT_REFUSED, f"notarization: {self.spec.file} is not a file in the workspace"
            )
        return file

    def _identity(self, context: EffectContext, recorded: Mapping[str, str]) -> tuple[str, str]:
        """The submission's name and the file's sha256: as recorded, else (the attempt died before it
        recorded them) as perform would have made them from the file."""
        if recorded.get("submission_name") and recorded.get("sha256"):
            return recorded["submission_name"], recorded["sha256"]
        file = self._submittable(context)
        sha256 = file_sha256(file)
        return submission_name(file, sha256, context.operation_id), sha256

    def _client(self, context: EffectContext) -> NotaryClient:
        key = self._key(context)
        return NotaryClient(
            context.endpoints.notary,
            lambda: bearer_token(dict(key), context.now()),
            upload_endpoint=self.upload_endpoint,
            time_left=context.time_left,
        )

    def _key(self, context: EffectContext) -> Mapping[str, object]:
        try:
            key = context.secret(self.spec.api_key)
        except EffectFailed:
            raise
        except (LookupError, ValueError) as error:
            raise EffectFailed(
                ErrorClass.EFFECT_REFUSED,
                f"notarization: the API key {self.spec.api_key} cannot be read: {error}",
            ) from error
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") not in SECRET_REFUSALS:
                raise
            raise EffectFailed(
                ErrorClass.EFFECT_REFUSED,
                f"notarization: the API key {self.spec.api_key} cannot be read: {error}",
            ) from error
        team_key(dict(key), where=f"notarization: the API key {self.spec.api_key}")
        return key


def _refused(what: str, refusal: NotaryRefused) -> str:
    if refusal.unauthorized:
        return (
            f"notarization: Apple refused the API key for {what} (401 NOT_AUTHORIZED): check its key_id, "
            "issuer_id and that the key is not revoked"
        )
    return f"notarization: Apple refused {what} ({refusal.status}): {refusal.detail}"


def _values(submission: Submission, sha256: str) -> dict[str, str]:
    return {
        "submission_id": submission.id,
        "submission_name": submission.name,
        "sha256": sha256,
        "apple_state": submission.status,
    }


def _log_or_note(client: NotaryClient, submission_id: str) -> dict[str, object]:
    try:
        return client.log(submission_id)
    except (NotaryUnreachable, NotaryRefused) as error:
        return {"statusSummary": f"Apple's log could not be read ({error})"}


def _issues(log: Mapping[str, object]) -> str:
    """Apple's log in a line: its summary and its issues (path: message)."""
    summary = str(log.get("statusSummary") or "no summary")
    issues = log.get("issues") or []
    shown = [
        f"{issue.get('path', '?')}: {issue.get('message', '?')}"
        for issue in (issues if isinstance(issues, list) else [])[:LOG_ISSUES_SHOWN]
        if isinstance(issue, dict)
    ]
    return summary + (" -- " + "; ".join(shown) if shown else "")
