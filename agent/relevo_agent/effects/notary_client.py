"""Apple's Notary API as the notarization kind uses it (developer.apple.com/documentation/notaryapi):
Submit Software, Get Submission Status, Get Previous Submissions (the team's 100 most recent),
Get Submission Log, and the file's upload to the S3 object a submission names with the temporary
credentials its answer carries.

What goes wrong is told apart, because the kind decides on it: `NotaryUnreachable` (no answer, a
lost one, a 5xx from the edge: the request may or may not have taken effect), `NotaryRefused` (a
4xx answer: Apple refused it, nothing taken; `unauthorized` for the 401 of a key Apple does not
accept).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import urllib3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

# Apple's bucket for submissions is in us-west-2 ("Customizing the notarization workflow"); its
# regional endpoint, as the credentials of Submit Software's answer are used by Apple's own sample.
UPLOAD_REGION = "us-west-2"
APPLE_UPLOAD_ENDPOINT = f"https://s3.{UPLOAD_REGION}.amazonaws.com"
HISTORY_SIZE = 100


class NotaryUnreachable(Exception):
    """No answer that says what happened: a network error, a connection closed without an answer,
    a 5xx. The request may have taken effect."""


class NotaryRefused(Exception):
    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"{status}: {detail}")
        self.status, self.detail = status, detail

    @property
    def unauthorized(self) -> bool:
        return self.status == 401


@dataclass(frozen=True)
class Submission:
    id: str
    name: str
    status: str  # Accepted, In Progress, Invalid, Rejected
    created: str


@dataclass(frozen=True)
class UploadTarget:
    """Where Submit Software's answer says the file goes, and the credentials for it (never logged)."""

    submission_id: str
    bucket: str
    object: str
    access_key_id: str
    secret_access_key: str
    session_token: str


class NotaryClient:
    def __init__(
        self,
        base: str,
        token: Callable[[], str],
        upload_endpoint: str | None = None,
        timeout_sec: float = 30,
        time_left: Callable[[], float] | None = None,
    ) -> None:
        # `base` ends with /notary/v2 (Apple's https://appstoreconnect.apple.com/notary/v2).
        self.base = base.rstrip("/")
        self.token = token
        self.upload_endpoint = upload_endpoint
        self.timeout_sec = timeout_sec
        # The stage's time left: no request outlasts it (the lease's deadline is the agent's own).
        self.time_left = time_left or (lambda: timeout_sec)
        self.http = urllib3.PoolManager(retries=False)

    def _timeout(self) -> urllib3.Timeout:
        seconds = max(1.0, min(self.timeout_sec, self.time_left()))
        return urllib3.Timeout(connect=min(10.0, seconds), read=seconds)

    def _call(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {self.token()}", "Accept": "application/json"}
        payload = None
        if body is not None:
            headers["Content-Type"] = "application/json"
            payload = json.dumps(body).encode()
        try:
            answer = self.http.request(
                method, self.base + path, body=payload, headers=headers, timeout=self._timeout()
            )
        except urllib3.exceptions.HTTPError as error:
            raise NotaryUnreachable(f"{method} {path}: {error}") from error
        if answer.status >= 500:
            raise NotaryUnreachable(f"{method} {path}: HTTP {answer.status}")
        try:
            document = json.loads(answer.data) if answer.data else {}
        except ValueError as error:
            raise NotaryUnreachable(f"{method} {path}: HTTP {answer.status}, not JSON") from error
        if answer.status >= 400:
            errors = document.get("errors") if isinstance(document, dict) else None
            detail = errors[0].get("detail", "") if errors and isinstance(errors[0], dict) else ""
            raise NotaryRefused(answer.status, detail or answer.reason or "")
        if not isinstance(document, dict) or not isinstance(document.get("data"), dict | list):
            raise NotaryUnreachable(f"{method} {path}: an answer with no data")
        return document

    def submit(self, sha256: str, name: str) -> UploadTarget:
        data = self._call("POST", "/submissions", {"sha256": sha256, "submissionName": name})["data"]
        try:
            attributes = data["attributes"]
            return UploadTarget(
                submission_id=str(data["id"]),
                bucket=str(attributes["bucket"]),
                object=str(attributes["object"]),
                access_key_id=str(attributes["awsAccessKeyId"]),
                secret_access_key=str(attributes["awsSecretAccessKey"]),
                session_token=str(attributes["awsSessionToken"]),
            )
        except (KeyError, TypeError) as error:
            raise NotaryUnreachable(f"Submit Software answered without {error}") from error

    def status(self, submission_id: str) -> Submission:
        return _submission(self._call("GET", f"/submissions/{submission_id}")["data"])

    def history(self) -> list[Submission]:
        """The team's most recent submissions (at most HISTORY_SIZE, newest first, as Apple keeps)."""
        data = self._call("GET", "/submissions")["data"]
        return [_submission(item) for item in data] if isinstance(data, list) else []

    def log(self, submission_id: str) -> dict[str, Any]:
        """The submission's log (Apple's JSON: status, statusSummary, issues), from the URL Get
        Submission Log hands out (no bearer token: the URL is its own credential)."""
        data = self._call("GET", f"/submissions/{submission_id}/logs")["data"]
        url = data.get("attributes", {}).get("developerLogUrl") if isinstance(data, dict) else None
        if not isinstance(url, str):
            raise NotaryUnreachable("Get Submission Log answered without developerLogUrl")
        try:
            answer = self.http.request("GET", url, timeout=self._timeout())
        except urllib3.exceptions.HTTPError as error:
            # Not the error's text: it would carry the URL, a credential of its own (signed).
            raise NotaryUnreachable(f"the submission's log: {type(error).__name__}") from error
        if answer.status != 200:
            raise NotaryUnreachable(f"the submission's log: HTTP {answer.status}")
        try:
            log = json.loads(answer.data)
        except ValueError as error:
            raise NotaryUnreachable("the submission's log is not JSON") from error
        return log if isinstance(log, dict) else {}

    def upload(self, target: UploadTarget, file: Path) -> None:
        """The file to the submission's S3 object with its temporary credentials: Apple's bucket in
        us-west-2, or the endpoint this agent is configured with (the local service's stand-in,
        path-style). One PutObject: S3 takes up to 5 GB in one."""
        s3 = self.s3_client(target)
        try:
            with file.open("rb") as body:
                s3.put_object(Bucket=target.bucket, Key=target.object, Body=body)
        except (BotoCoreError, ClientError) as error:
            raise NotaryUnreachable(f"the upload to submission {target.submission_id}: {error}") from error

    def s3_client(self, target: UploadTarget) -> Any:
        """An S3 client with the submission's credentials only, for its bucket: never the agent's
        own credentials, and never an endpoint from the environment (AWS_ENDPOINT_URL points a
        local agent at its emulator, which is not where Apple's bucket is)."""
        if self.upload_endpoint is None:
            config = Config(region_name=UPLOAD_REGION, s3={"addressing_style": "virtual"})
        else:
            config = Config(region_name=UPLOAD_REGION, s3={"addressing_style": "path"})

        return boto3.session.Session().client(
            "s3",
            aws_access_key_id=target.access_key_id,
            aws_secret_access_key=target.secret_access_key,
            aws_session_token=target.session_token,
            # Always explicit: an endpoint given here wins over the environment's.
            endpoint_url=self.upload_endpoint or APPLE_UPLOAD_ENDPOINT,
            config=config,
        )


def _submission(data: Any) -> Submission:
    try:
        attributes = data["attributes"]
        return Submission(
            id=str(data["id"]),
            name=str(attributes["name"]),
            status=str(attributes["status"]),
            created=str(attributes.get("createdDate", "")),
        )
    except (KeyError, TypeError) as error:
        raise NotaryUnreachable(f"a submission without {error}") from error
