"""The Notary API as Apple documents it (developer.apple.com/documentation/notaryapi: Submit
Software, Get Submission Status, Get Previous Submissions, Get Submission Log): its documented
fields as pydantic models that refuse any other field, and the submissions it keeps.

A submission is `In Progress` from its creation until the file has been uploaded (here a PUT to
the service, where Apple hands out S3 credentials) and `review_sec` more have passed, then
`Accepted`, or `Invalid` / `Rejected` when armed so; a submission can be held `In Progress` for a
number of minutes (the field's "it took hours"). The history answers only the 100 most recent,
newest first, as Apple's does."""

from __future__ import annotations

import hashlib
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from relevo_local.apple.clock import iso

Status = Literal["Accepted", "In Progress", "Invalid", "Rejected"]
HISTORY = 100


class _Documented(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Notification(_Documented):
    channel: Literal["webhook"]
    target: str


class NewSubmissionRequest(_Documented):
    sha256: str = Field(pattern=r"^[0-9a-fA-F]{64}$")
    submissionName: str = Field(min_length=1)  # noqa: N815 (Apple's field name)
    notifications: list[Notification] | None = None


class NewSubmissionAttributes(_Documented):
    awsAccessKeyId: str  # noqa: N815
    awsSecretAccessKey: str  # noqa: N815
    awsSessionToken: str  # noqa: N815
    bucket: str
    object: str


class NewSubmissionData(_Documented):
    attributes: NewSubmissionAttributes
    id: str
    type: Literal["newSubmissions"]


class Meta(_Documented):
    pass


class NewSubmissionResponse(_Documented):
    data: NewSubmissionData
    meta: Meta


class SubmissionAttributes(_Documented):
    createdDate: str  # noqa: N815
    name: str
    status: Status


class SubmissionData(_Documented):
    attributes: SubmissionAttributes
    id: str
    type: Literal["submissions"]


class SubmissionResponse(_Documented):
    data: SubmissionData
    meta: Meta


class SubmissionListResponse(_Documented):
    data: list[SubmissionData]
    meta: Meta


class LogAttributes(_Documented):
    developerLogUrl: str  # noqa: N815


class LogData(_Documented):
    attributes: LogAttributes
    id: str
    type: Literal["submissionsLog"]


class SubmissionLogURLResponse(_Documented):
    data: LogData
    meta: Meta


@dataclass
class Submission:
    id: str
    name: str
    sha256: str
    created: datetime
    uploaded_at: datetime | None = None
    received_sha256: str | None = None
    outcome: Status = "Accepted"
    held_until: datetime | None = None


class NotaryError(Exception):
    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status, self.detail = status, detail


class NotaryState:
    def __init__(self, now: Callable[[], datetime], review_sec: float = 180.0) -> None:
        self.now = now
        self.review_sec = review_sec
        self.submissions: dict[str, Submission] = {}
        self.lock = threading.Lock()
        # Armed by the faults, each for the next submission created.
        self.next_outcomes: list[Status] = []
        self.next_holds_sec: list[float] = []

    def submit(self, request: NewSubmissionRequest) -> Submission:
        with self.lock:
            created = self.now()
            submission = Submission(
                str(uuid.uuid4()), request.submissionName, request.sha256.lower(), created
            )
            if self.next_outcomes:
                submission.outcome = self.next_outcomes.pop(0)
            if self.next_holds_sec:
                submission.held_until = created + timedelta(seconds=self.next_holds_sec.pop(0))
            self.submissions[submission.id] = submission
            return submission

    def get(self, submission_id: str) -> Submission:
        submission = self.submissions.get(submission_id.lower())
        if submission is None:
            raise NotaryError(404, f"There is no submission with id {submission_id}")
        return submission

    def receive(self, submission_id: str, data: bytes) -> None:
        with self.lock:
            submission = self.get(submission_id)
            submission.received_sha256 = hashlib.sha256(data).hexdigest()
            submission.uploaded_at = self.now()

    def status(self, submission: Submission) -> Status:
        now = self.now()
        if submission.uploaded_at is None or now < submission.uploaded_at + timedelta(
            seconds=self.review_sec
        ):
            return "In Progress"
        if submission.held_until is not None and now < submission.held_until:
            return "In Progress"
        if submission.received_sha256 != submission.sha256:
            return "Invalid"  # the file is not the one announced
        return submission.outcome

    def history(self) -> list[Submission]:
        with self.lock:
            newest_first = sorted(self.submissions.values(), key=lambda s: s.created, reverse=True)
            return newest_first[:HISTORY]

    def add_past(self, count: int, name: str = "older-release.zip") -> None:
        """Submissions made before: enough of them roll an earlier one out of the history."""
        with self.lock:
            for _ in range(count):
                done = self.now() - timedelta(seconds=self.review_sec)
                submission = Submission(str(uuid.uuid4()), name, "0" * 64, self.now(), done, "0" * 64)
                self.submissions[submission.id] = submission

    def data(self, submission: Submission) -> SubmissionData:
        attributes = SubmissionAttributes(
            createdDate=iso(submission.created), name=submission.name, status=self.status(submission)
        )
        return SubmissionData(attributes=attributes, id=submission.id, type="submissions")

    def log(self, submission: Submission) -> dict[str, object]:
        status = self.status(submission)
        invalid = {
            "severity": "error",
            "path": submission.name,
            "message": "The signature of the binary is invalid.",
        }
        return {
            "jobId": submission.id,
            "status": status,
            "statusSummary": "Ready for distribution" if status == "Accepted" else "Not accepted",
            "archiveFilename": submission.name,
            "uploadDate": iso(submission.created),
            "sha256": submission.received_sha256,
            "issues": [invalid] if status == "Invalid" else None,
        }
