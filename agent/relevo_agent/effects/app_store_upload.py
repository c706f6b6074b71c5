"""The app_store_upload effect: an .ipa or .pkg to App Store Connect by its Build Uploads API,
exactly once (docs/release-effects.md).

An upload is this operation's when its asset file carries this file's SHA-256 (the checksum the
commit gave, which App Store Connect keeps as the file's sourceFileChecksums): Apple keeps no name
of ours on an upload, and refuses a second upload of a version and build number, so the version,
the build number and the checksum are what a later attempt looks for. The identifiers are recorded
before the upload is created, its id the moment Apple answers; a create or a commit with no answer
(the connection lost, a 504) is followed by a look, never by a blind repeat."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from botocore.exceptions import BotoCoreError, ClientError

from relevo_agent.effects.app_store_connect import ConnectClient, NoAnswer, Refused, Upload
from relevo_agent.effects.apple_token import bearer_token, team_key
from relevo_agent.effects.ipa import Binary, read_binary
from relevo_agent.effects.kind import Answer, EffectContext, EffectFailed, ProbeAnswer
from relevo_core.models.effect import AppStoreUpload
from relevo_core.models.errors import ErrorClass

T = TypeVar("T")
POLL_SEC = 30.0
REDUNDANT_BINARY = "ITMS-90189"
# Build.processingState: the ends of processing.
BUILD_REJECTED = ("INVALID", "FAILED")


def next_free(numbers: list[str]) -> str:
    """The build number after the highest of `numbers` (dot-separated integers: the last one up)."""
    parsed = [
        tuple(int(p) for p in n.split(".")) for n in numbers if n and all(p.isdigit() for p in n.split("."))
    ]
    highest = max(parsed, default=(0,))
    return ".".join(str(p) for p in (*highest[:-1], highest[-1] + 1))


class AppStoreUploadEffect:
    def __init__(self, spec: AppStoreUpload, poll_sec: float = POLL_SEC) -> None:
        """`poll_sec`: how often processing is asked about while the stage waits for it."""
        self.spec = spec
        self.poll_sec = poll_sec

    # -- the three entry points (relevo_agent.effects.kind.EffectKind)

    def perform(self, context: EffectContext) -> dict[str, str]:
        binary = read_binary(self.spec, context.file)
        client = self._client(context)
        values = self._values(binary)
        self._check_app(client)
        earlier = self._look(client, binary)
        mine = [u for u in earlier if u.sha256 == binary.sha256 and u.state != "FAILED"]
        if mine:
            context.line(f"App Store Connect already has this file as upload {mine[0].id}: not sent again")
            context.record({**values, "upload_id": mine[0].id})
            return self._finish(context, client, binary, mine[0].id)
        self._refuse_if_used(context, client, binary, [u for u in earlier if u.state != "FAILED"])
        context.record(values)
        upload_id = self._create(context, client, binary, {u.id for u in earlier})
        context.record({**values, "upload_id": upload_id})
        self._send(context, client, binary, upload_id)
        return self._finish(context, client, binary, upload_id)

    def probe(self, context: EffectContext, recorded: Mapping[str, str]) -> ProbeAnswer:
        try:
            binary = read_binary(self.spec, context.file)
        except EffectFailed as error:
            return ProbeAnswer(Answer.CANNOT_TELL, f"the file cannot be read to look for it: {error.message}")
        if not recorded:
            # The identifiers are recorded before any request that could create an upload.
            return ProbeAnswer(Answer.ABSENT, "nothing was recorded: no upload was started")
        if recorded.get("sha256") not in (None, binary.sha256):
            return ProbeAnswer(
                Answer.CANNOT_TELL, f"the file is not the one recorded (sha256 {recorded['sha256']})"
            )
        try:
            client = self._client(context)
            uploads = self._look(client, binary)
            return self._answer(client, binary, uploads, recorded.get("upload_id"))
        except EffectFailed as error:
            return ProbeAnswer(Answer.CANNOT_TELL, error.message)
        except (NoAnswer, Refused) as error:
            return ProbeAnswer(Answer.CANNOT_TELL, f"App Store Connect could not be asked: {error}")

    def resume(self, context: EffectContext, recorded: Mapping[str, str]) -> dict[str, str]:
        binary = read_binary(self.spec, context.file)
        client = self._client(context)
        upload_id = recorded.get("upload_id")
        if not upload_id:
            mine = [u for u in self._look(client, binary) if u.sha256 == binary.sha256]
            if not mine:
                raise EffectFailed(
                    ErrorClass.MANUAL_REVIEW, "no upload of this file to resume at App Store Connect"
                )
            upload_id = mine[0].id
        upload = self._call(client.upload, upload_id)
        if upload.state == "AWAITING_UPLOAD":
            # The upload this operation created, its bytes not all committed: finish sending them.
            self._send(context, client, binary, upload_id)
        return self._finish(context, client, binary, upload_id)

    # -- the steps

    def _client(self, context: EffectContext) -> ConnectClient:
        where = f"the API key {self.spec.api_key}"
        try:
            key = context.secret(self.spec.api_key)
        except EffectFailed:
            raise
        except ClientError as error:
            # GetSecretValue's refusals (ResourceNotFoundException, AccessDeniedException, ...).
            code = error.response.get("Error", {}).get("Code", "ClientError")
            raise EffectFailed(ErrorClass.EFFECT_REFUSED, f"{where} cannot be read: {code}") from None
        except BotoCoreError as error:
            raise EffectFailed(
                ErrorClass.NETWORK_TIMEOUT, f"{where}: Secrets Manager unreachable ({error})"
            ) from None
        except (LookupError, ValueError) as error:
            raise EffectFailed(ErrorClass.EFFECT_REFUSED, f"{where} cannot be read: {error}") from None
        team_key(key, where)
        return ConnectClient(context.endpoints.app_store_connect, lambda: bearer_token(key, context.now()))

    def _values(self, binary: Binary) -> dict[str, str]:
        return {
            "app_id": self.spec.app_id,
            "build_version": binary.version,
            "build_number": binary.build,
            "sha256": binary.sha256,
        }

    def _call(self, request: Callable[..., T], *args: Any) -> T:
        """A request of perform or resume: a refusal or no answer is the stage's failure."""
        try:
            return request(*args)
        except (Refused, NoAnswer) as error:
            raise self._failure(error) from None

    def _failure(self, error: Refused | NoAnswer) -> EffectFailed:
        if isinstance(error, NoAnswer):
            return EffectFailed(ErrorClass.NETWORK_TIMEOUT, f"App Store Connect did not answer: {error}")
        if error.status in (401, 403):
            return EffectFailed(
                ErrorClass.EFFECT_REFUSED,
                f"App Store Connect refused the API key {self.spec.api_key} ({error})",
            )
        return EffectFailed(ErrorClass.CLIENT_4XX, f"App Store Connect refused: {error}")

    def _check_app(self, client: ConnectClient) -> None:
        try:
            client.app(self.spec.app_id)
        except Refused as refusal:
            if refusal.status == 404:
                raise EffectFailed(
                    ErrorClass.EFFECT_REFUSED,
                    f"App Store Connect has no app {self.spec.app_id} for this key's team",
                ) from None
            raise self._failure(refusal) from None
        except NoAnswer as error:
            raise self._failure(error) from None

    def _look(self, client: ConnectClient, binary: Binary) -> list[Upload]:
        return self._call(
            lambda: client.uploads(self.spec.app_id, self.spec.platform, binary.version, binary.build)
        )

    def _refuse_if_used(
        self, context: EffectContext, client: ConnectClient, binary: Binary, others: list[Upload]
    ) -> None:
        numbers = self._call(lambda: client.build_numbers(self.spec.app_id, binary.version))
        if others or binary.build in numbers:
            raise self._used(context, client, binary, numbers)

    def _used(
        self, context: EffectContext, client: ConnectClient, binary: Binary, numbers: list[str]
    ) -> EffectFailed:
        """The refusal of a build number Apple already has, naming the next free one (the highest
        of that version's builds and uploads, plus one). When it is the job's RELEVO_BUILD_NUMBER,
        the project's counter is behind the App Store (builds uploaded outside Relevo): every
        retry and rerun of the job keeps its number, so the refusal names the floor to set for
        the next job (docs/jobs.md#build-numbers)."""
        everything = self._call(lambda: client.uploads(self.spec.app_id, self.spec.platform, binary.version))
        free = next_free(numbers + [u.build for u in everything if u.state != "FAILED"] + [binary.build])
        message = (
            f"build number {binary.build} is already used for version {binary.version}; "
            f"the next free one is {free}"
        )
        if context.build_number is not None and binary.build == str(context.build_number):
            message += (
                ". It is this job's RELEVO_BUILD_NUMBER, which its retries and reruns keep: set the "
                f"project's build_number.floor to {free} (relevo project apply) and start a new job"
            )
        return EffectFailed(ErrorClass.EFFECT_REFUSED, message)

    def _create(self, context: EffectContext, client: ConnectClient, binary: Binary, seen: set[str]) -> str:
        platform, app_id = self.spec.platform, self.spec.app_id
        try:
            return client.create_upload(app_id, platform, binary.version, binary.build)
        except Refused as refusal:
            if any(code.endswith("DUPLICATE") for code in refusal.codes):
                # Another upload of this build number came first (between the look and the create).
                numbers = self._call(lambda: client.build_numbers(self.spec.app_id, binary.version))
                raise self._used(context, client, binary, numbers) from None
            raise self._failure(refusal) from None
        except NoAnswer as error:
            # It may have been created: look before anything is sent again.
            context.line(f"creating the upload had no answer ({error}): looking for it")
        created = [u for u in self._look(client, binary) if u.id not in seen and u.state != "FAILED"]
        if len(created) == 1:
            return created[0].id
        raise EffectFailed(
            ErrorClass.NETWORK_TIMEOUT,
            "creating the upload had no answer and App Store Connect shows none: a retry creates it",
        )

    def _send(self, context: EffectContext, client: ConnectClient, binary: Binary, upload_id: str) -> None:
        """The file of this operation's upload reserved (or found), its bytes sent, then committed
        with their SHA-256 -- each step that had no answer looked at before it is done again."""
        files = self._call(client.upload_files, upload_id)
        if not files:
            try:
                files = [client.create_file(upload_id, binary.path.name, binary.size, binary.uti)]
            except Refused as refusal:
                raise self._failure(refusal) from None
            except NoAnswer as error:
                context.line(f"reserving the file had no answer ({error}): looking for it")
                files = self._call(client.upload_files, upload_id)
                if not files:
                    raise self._failure(error) from None
        file_id = str(files[0]["id"])
        upload_file = self._call(client.file, file_id)
        if "sourceFileChecksums" in upload_file["attributes"]:
            return  # committed by an earlier attempt: processing has started
        with binary.path.open("rb") as source:
            self._call(client.send_parts, upload_file, source)
        context.line(f"sent {binary.size} bytes of {binary.path.name} to upload {upload_id}")
        try:
            client.commit_file(file_id, binary.sha256)
        except Refused as refusal:
            raise self._failure(refusal) from None
        except NoAnswer as error:
            # The commit may have taken: look at the file before committing again.
            context.line(f"committing the upload had no answer ({error}): looking at it")
            if "sourceFileChecksums" not in self._call(client.file, file_id)["attributes"]:
                self._call(client.commit_file, file_id, binary.sha256)

    def _finish(
        self, context: EffectContext, client: ConnectClient, binary: Binary, upload_id: str
    ) -> dict[str, str]:
        """The values once processing is over (or, without wait_for_processing, once committed)."""
        values = {**self._values(binary), "upload_id": upload_id}
        shown = ""
        while True:
            upload = self._call(client.upload, upload_id)
            state = upload.state
            if upload.build_id:
                values["build_id"] = upload.build_id
                state = self._call(client.processing_state, upload.build_id)
            values["apple_state"] = state
            if state != shown:
                # Each change of Apple's state, as it happens: in the stage's log and on the stage.
                context.line(f"upload {upload_id}: {state}")
                context.record(dict(values))
                shown = state
            if state == "VALID" or (not self.spec.wait_for_processing and state != "AWAITING_UPLOAD"):
                return values
            if state == "FAILED" and upload.build_id is None:
                if REDUNDANT_BINARY in upload.error_codes:
                    other = self._same_elsewhere(client, binary, upload_id)
                    if other is not None:
                        context.line(f"{REDUNDANT_BINARY}: this file is upload {other}: reading that one")
                        upload_id = values["upload_id"] = other
                        continue
                raise EffectFailed(
                    ErrorClass.EFFECT_REJECTED, f"upload {upload_id} FAILED: {'; '.join(upload.errors)}"
                )
            if state in BUILD_REJECTED:
                raise EffectFailed(
                    ErrorClass.EFFECT_REJECTED, f"build {upload.build_id} of upload {upload_id} is {state}"
                )
            left = context.time_left()
            if left <= 0:
                raise EffectFailed(ErrorClass.EXEC_TIMEOUT, f"upload {upload_id} still {state}: out of time")
            if context.wait(min(self.poll_sec, left)):
                raise EffectFailed(ErrorClass.AGENT_SHUTDOWN, f"stopped while upload {upload_id} was {state}")

    def _same_elsewhere(self, client: ConnectClient, binary: Binary, upload_id: str) -> str | None:
        found = self._look(client, binary)
        return next(
            (u.id for u in found if u.id != upload_id and u.sha256 == binary.sha256 and u.state != "FAILED"),
            None,
        )

    def _answer(
        self, client: ConnectClient, binary: Binary, uploads: list[Upload], upload_id: str | None
    ) -> ProbeAnswer:
        live = [u for u in uploads if u.state != "FAILED"]
        mine = [u for u in live if u.sha256 == binary.sha256 or (u.sha256 is None and u.id == upload_id)]
        if not mine:
            failed = [u for u in uploads if u.sha256 == binary.sha256 and u.id == upload_id]
            if failed and REDUNDANT_BINARY not in failed[0].error_codes:
                # Apple's no for this operation's upload: resume reads it and fails the stage.
                return ProbeAnswer(
                    Answer.IN_PROGRESS, f"upload {failed[0].id} FAILED: {'; '.join(failed[0].errors)}"
                )
            if live:
                shown = ", ".join(f"{u.id} ({u.state}, sha256 {u.sha256 or 'none yet'})" for u in live)
                return ProbeAnswer(
                    Answer.CANNOT_TELL,
                    f"build {binary.build} of {binary.version} is another file's upload: {shown}",
                )
            return ProbeAnswer(
                Answer.ABSENT, f"no upload of {binary.version} ({binary.build}) at App Store Connect"
            )
        upload = mine[0]
        state = upload.state
        if upload.build_id:
            state = client.processing_state(upload.build_id)
        evidence = f"upload {upload.id} of {binary.version} ({binary.build}), sha256 {binary.sha256}: {state}"
        committed = state not in ("AWAITING_UPLOAD",)
        if state == "VALID" or (
            not self.spec.wait_for_processing and committed and state not in BUILD_REJECTED
        ):
            values = {**self._values(binary), "upload_id": upload.id, "apple_state": state}
            if upload.build_id:
                values["build_id"] = upload.build_id
            return ProbeAnswer(Answer.DONE, evidence, values)
        return ProbeAnswer(Answer.IN_PROGRESS, evidence)
