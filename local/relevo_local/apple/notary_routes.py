"""The Notary API's endpoints (/notary/v2/submissions ...) and the S3 stand-in its submissions
upload to. Requests and answers go through the documented pydantic models (relevo_local.apple.
notary): a field the documentation does not name, or a missing one, is refused as a mismatch."""

from __future__ import annotations

import secrets
from typing import Any

from pydantic import BaseModel, ValidationError

from relevo_local.apple.notary import (
    LogAttributes,
    LogData,
    Meta,
    NewSubmissionAttributes,
    NewSubmissionData,
    NewSubmissionRequest,
    NewSubmissionResponse,
    NotaryError,
    NotaryState,
    SubmissionListResponse,
    SubmissionLogURLResponse,
    SubmissionResponse,
)

BUCKET = "notary-submissions-local"


class NotaryUploads:
    """The temporary credentials handed out per submission, and the object key each may write."""

    def __init__(self) -> None:
        self.tokens: dict[str, str] = {}  # object key -> session token
        self.objects: dict[str, str] = {}  # object key -> submission id


def operation_of(method: str, path: str) -> str:
    parts = path.strip("/").split("/")  # notary, v2, submissions[, id[, logs]]
    if method == "POST" and len(parts) == 3:
        return "submitSoftware"
    if len(parts) == 3:
        return "getPreviousSubmissions"
    return "getSubmissionLog" if len(parts) == 5 else "getSubmissionStatus"


def request_model(body: Any) -> NewSubmissionRequest:
    return NewSubmissionRequest.model_validate(body)


def answer(
    state: NotaryState, uploads: NotaryUploads, base: str, method: str, path: str, body: Any
) -> tuple[int, BaseModel]:
    operation = operation_of(method, path)
    parts = path.strip("/").split("/")
    if operation == "submitSoftware":
        submission = state.submit(request_model(body))
        key = f"prefix/{submission.id}"
        uploads.tokens[key] = secrets.token_urlsafe(24)
        uploads.objects[key] = submission.id
        attributes = NewSubmissionAttributes(
            awsAccessKeyId="ASIA" + secrets.token_hex(8).upper(),
            awsSecretAccessKey=secrets.token_urlsafe(30),
            awsSessionToken=uploads.tokens[key],
            bucket=BUCKET,
            object=key,
        )
        data = NewSubmissionData(attributes=attributes, id=submission.id, type="newSubmissions")
        return 200, NewSubmissionResponse(data=data, meta=Meta())
    if operation == "getPreviousSubmissions":
        return 200, SubmissionListResponse(data=[state.data(s) for s in state.history()], meta=Meta())
    submission = state.get(parts[3])
    if operation == "getSubmissionStatus":
        return 200, SubmissionResponse(data=state.data(submission), meta=Meta())
    if state.status(submission) == "In Progress":
        raise NotaryError(404, f"The log for submission {submission.id} is not available yet")
    log = LogData(
        attributes=LogAttributes(developerLogUrl=f"{base}/notary-logs/{submission.id}"),
        id=submission.id,
        type="submissionsLog",
    )
    return 200, SubmissionLogURLResponse(data=log, meta=Meta())


def problems_of(error: ValidationError) -> list[str]:
    return [f"body.{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors()]


def error_document(status: int, detail: str) -> dict[str, Any]:
    return {"errors": [{"status": str(status), "code": "NOT_FOUND" if status == 404 else "BAD_REQUEST",
                        "title": detail, "detail": detail}]}  # fmt: skip
