"""What App Store Connect keeps about builds, as Apple keeps it: apps, build uploads with their
files, and the builds that processing makes of them, each state a function of the injected clock.

An upload's life (BuildUploadState in the description): AWAITING_UPLOAD until its asset file is
committed (PATCH uploaded: true), then PROCESSING for `upload_processing_sec`, then COMPLETE with a
build, or FAILED with the errors. The build (Build.processingState) is PROCESSING for
`build_processing_sec`, then VALID, or INVALID / FAILED when armed so. A second upload of a
version and build number an app already has is refused (ConnectError DUPLICATE, the API's 409)."""

from __future__ import annotations

import hashlib
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal

UploadState = Literal["AWAITING_UPLOAD", "PROCESSING", "FAILED", "COMPLETE"]
ProcessingState = Literal["PROCESSING", "FAILED", "INVALID", "VALID"]
REDUNDANT_BINARY = (
    "ITMS-90189",
    "Redundant Binary Upload. You've already uploaded a build with build number '{build}' for "
    "version number '{version}'. Make sure you increment the build string before you upload your "
    "app to App Store Connect.",
)


class ConnectError(Exception):
    """A refusal as App Store Connect words it (rendered as an ErrorResponse by connect_routes)."""

    def __init__(self, status: int, code: str, title: str, detail: str, pointer: str | None = None) -> None:
        super().__init__(detail)
        self.status, self.code, self.title, self.detail, self.pointer = status, code, title, detail, pointer


def not_found(kind: str, resource_id: str) -> ConnectError:
    return ConnectError(
        404,
        "NOT_FOUND",
        "The specified resource does not exist",
        f"There is no resource of type '{kind}' with id '{resource_id}'",
    )


@dataclass
class App:
    id: str
    bundle_id: str
    name: str
    sku: str


@dataclass
class UploadFile:
    id: str
    upload_id: str
    file_name: str
    file_size: int
    uti: str
    asset_type: str
    received: bytearray = field(default_factory=bytearray)
    sha256: str | None = None
    committed: bool = False


@dataclass
class Build:
    id: str
    app_id: str
    version: str
    short_version: str
    upload_id: str
    uploaded: datetime
    processed_at: datetime
    outcome: ProcessingState = "VALID"


@dataclass
class BuildUpload:
    id: str
    app_id: str
    short_version: str
    version: str
    platform: str
    created: datetime
    file_ids: list[str] = field(default_factory=list)
    committed_at: datetime | None = None
    build_id: str | None = None
    # What processing will end in: None (a build), or the errors it fails with.
    failure: tuple[str, str] | None = None
    errors: list[tuple[str, str]] = field(default_factory=list)


@dataclass
class Timing:
    upload_processing_sec: float = 60.0
    build_processing_sec: float = 300.0


class ConnectState:
    def __init__(self, now: Callable[[], datetime], timing: Timing | None = None) -> None:
        self.now = now
        self.timing = timing or Timing()
        self.apps: dict[str, App] = {}
        self.uploads: dict[str, BuildUpload] = {}
        self.files: dict[str, UploadFile] = {}
        self.builds: dict[str, Build] = {}
        self.lock = threading.RLock()
        # Armed by the faults: the next second upload of a build passes creation and fails in
        # processing with ITMS-90189 (what Transporter and altool report) instead of the API's 409.
        self.redundant_fails_in_processing = 0
        # Armed outcomes for the next builds processing makes: INVALID or FAILED instead of VALID.
        self.next_build_outcomes: list[ProcessingState] = []

    def add_app(self, bundle_id: str, name: str, app_id: str | None = None) -> App:
        with self.lock:
            app = App(app_id or str(1_000_000_000 + len(self.apps) + 1), bundle_id, name, f"SKU-{bundle_id}")
            self.apps[app.id] = app
            return app

    def app(self, app_id: str) -> App:
        app = self.apps.get(app_id)
        if app is None:
            raise not_found("apps", app_id)
        return app

    def create_upload(self, app_id: str, short_version: str, version: str, platform: str) -> BuildUpload:
        with self.lock:
            self.advance()
            app = self.apps.get(app_id)
            if app is None:
                raise ConnectError(
                    409,
                    "ENTITY_ERROR.RELATIONSHIP.INVALID",
                    "The provided entity includes a relationship with an invalid value",
                    f"There is no app with id '{app_id}' for this team.",
                    "/data/relationships/app",
                )
            earlier = [
                u
                for u in self.uploads.values()
                if (u.app_id, u.short_version, u.version, u.platform)
                == (app_id, short_version, version, platform)
                and self.upload_state(u) != "FAILED"
            ]
            upload = BuildUpload(str(uuid.uuid4()), app_id, short_version, version, platform, self.now())
            if earlier and self.redundant_fails_in_processing > 0:
                self.redundant_fails_in_processing -= 1
                code, text = REDUNDANT_BINARY
                upload.failure = (code, text.format(build=version, version=short_version))
            elif earlier:
                raise ConnectError(
                    409,
                    "ENTITY_ERROR.ATTRIBUTE.INVALID.DUPLICATE",
                    "The provided entity includes an attribute with a value that has already been used",
                    "The bundle version must be higher than the previously uploaded version.",
                    "/data/attributes/cfBundleVersion",
                )
            self.uploads[upload.id] = upload
            return upload

    def upload(self, upload_id: str) -> BuildUpload:
        with self.lock:
            self.advance()
            upload = self.uploads.get(upload_id)
            if upload is None:
                raise not_found("buildUploads", upload_id)
            return upload

    def create_file(
        self, upload_id: str, file_name: str, file_size: int, uti: str, asset_type: str
    ) -> UploadFile:
        with self.lock:
            upload = self.upload(upload_id)
            if upload.committed_at is not None:
                raise ConnectError(
                    409,
                    "ENTITY_ERROR.RELATIONSHIP.INVALID",
                    "The provided entity includes a relationship with an invalid value",
                    f"Build upload '{upload_id}' is no longer awaiting files.",
                    "/data/relationships/buildUpload",
                )
            upload_file = UploadFile(str(uuid.uuid4()), upload_id, file_name, file_size, uti, asset_type)
            self.files[upload_file.id] = upload_file
            upload.file_ids.append(upload_file.id)
            return upload_file

    def file(self, file_id: str) -> UploadFile:
        upload_file = self.files.get(file_id)
        if upload_file is None:
            raise not_found("buildUploadFiles", file_id)
        return upload_file

    def receive_part(self, file_id: str, offset: int, data: bytes) -> None:
        with self.lock:
            upload_file = self.file(file_id)
            if offset + len(data) > upload_file.file_size:
                raise ConnectError(400, "PARAMETER_ERROR.INVALID", "A parameter has an invalid value",
                                   "The part goes past the file's declared size.")  # fmt: skip
            upload_file.received[offset : offset + len(data)] = data

    def commit_file(self, file_id: str, sha256: str | None) -> UploadFile:
        """`uploaded: true`: the bytes are all there (and match the checksum given); processing
        of the whole upload starts from this moment."""
        with self.lock:
            upload_file = self.file(file_id)
            if upload_file.committed:
                return upload_file
            if len(upload_file.received) != upload_file.file_size:
                raise ConnectError(
                    409,
                    "ENTITY_ERROR.ATTRIBUTE.INVALID",
                    "The provided entity includes an attribute with an invalid value",
                    f"{len(upload_file.received)} of {upload_file.file_size} bytes were uploaded.",
                    "/data/attributes/uploaded",
                )
            actual = hashlib.sha256(upload_file.received).hexdigest()
            if sha256 is not None and sha256.lower() != actual:
                raise ConnectError(
                    409,
                    "ENTITY_ERROR.ATTRIBUTE.INVALID",
                    "The provided entity includes an attribute with an invalid value",
                    "The source file checksum does not match the uploaded bytes.",
                    "/data/attributes/sourceFileChecksums",
                )
            upload_file.sha256 = actual
            upload_file.committed = True
            upload = self.uploads[upload_file.upload_id]
            if all(self.files[f].committed for f in upload.file_ids):
                upload.committed_at = self.now()
            return upload_file

    def upload_state(self, upload: BuildUpload) -> UploadState:
        if upload.committed_at is None:
            return "AWAITING_UPLOAD"
        if self.now() < upload.committed_at + timedelta(seconds=self.timing.upload_processing_sec):
            return "PROCESSING"
        return "FAILED" if upload.failure else "COMPLETE"

    def advance(self) -> None:
        """Processing that the clock has reached: a COMPLETE upload gets its build."""
        with self.lock:
            for upload in self.uploads.values():
                state = self.upload_state(upload)
                if state == "FAILED" and upload.failure and not upload.errors:
                    upload.errors.append(upload.failure)
                if state != "COMPLETE" or upload.build_id is not None or upload.committed_at is None:
                    continue
                done = upload.committed_at + timedelta(seconds=self.timing.upload_processing_sec)
                outcome = self.next_build_outcomes.pop(0) if self.next_build_outcomes else "VALID"
                build = Build(
                    str(uuid.uuid4()), upload.app_id, upload.version, upload.short_version, upload.id, done,
                    done + timedelta(seconds=self.timing.build_processing_sec), outcome,
                )  # fmt: skip
                self.builds[build.id] = build
                upload.build_id = build.id

    def processing_state(self, build: Build) -> ProcessingState:
        return "PROCESSING" if self.now() < build.processed_at else build.outcome

    def builds_of(self, app_id: str) -> list[Build]:
        with self.lock:
            self.advance()
            return [b for b in self.builds.values() if b.app_id == app_id]

    def uploads_of(self, app_id: str) -> list[BuildUpload]:
        with self.lock:
            self.advance()
            self.app(app_id)
            return [u for u in self.uploads.values() if u.app_id == app_id]
