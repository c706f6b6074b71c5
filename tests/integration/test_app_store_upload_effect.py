"""The app_store_upload effect (relevo_agent.effects.app_store_upload, issue 44) against the local
App Store Connect (relevo_local.apple): perform, probe and resume, the faults the field reports,
and every bad input refused before anything is created. Every request the kind makes passes the
service's check against Apple's description (the fixture asserts no mismatch). Time is the
service's injected clock, moved by the context's `wait`: no real sleep."""

from __future__ import annotations

import dataclasses
import io
import plistlib
import zipfile

import pytest

from relevo_agent.effects.app_store_upload import AppStoreUploadEffect, next_free
from relevo_agent.effects.kind import Answer, EffectFailed, Endpoints
from relevo_core.models.effect import AppStoreUpload
from relevo_core.models.errors import ErrorClass
from tests.helpers.effect_context import Attempt, key_secret
from tests.helpers.local_apple import local_apple, new_key, upload_build

SECRET = "relevo/dev/_release/app/asc-key"
CREATE, COMMIT = "buildUploadsCreateInstance", "buildUploadFilesUpdateInstance"


def make_ipa(version: str = "1.4.0", build: str = "42", fmt=plistlib.FMT_XML, filler: bytes = b"") -> bytes:
    info = {
        "CFBundleIdentifier": "com.example.relevo",
        "CFBundleShortVersionString": version,
        "CFBundleVersion": build,
    }
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        archive.writestr("Payload/App.app/Info.plist", plistlib.dumps(info, fmt=fmt))
        archive.writestr("Payload/App.app/App", b"\xcf\xfa\xed\xfe" + filler + bytes(range(256)) * 40)
    return out.getvalue()


@pytest.fixture
def apple(tmp_path):
    with local_apple() as (service, client):
        app = service.connect.add_app("com.example.relevo", "Relevo Example")
        attempt = Attempt({SECRET: key_secret(client.key)}, service)
        ipa = tmp_path / "App.ipa"
        ipa.write_bytes(make_ipa())
        yield service, client, app.id, attempt, ipa


def _effect(app_id: str, **fields) -> AppStoreUploadEffect:
    spec = {"kind": "app_store_upload", "file": "App.ipa", "app_id": app_id, "api_key": SECRET, **fields}
    return AppStoreUploadEffect(AppStoreUpload.model_validate(spec))


def test_perform_records_before_creating_then_sends_commits_and_waits_until_valid(apple):
    service, _, app_id, attempt, ipa = apple
    # Given the uploads the service holds each time the kind records
    uploads_at_record = []
    attempt.on_record = lambda _: uploads_at_record.append(len(service.connect.uploads))

    # When the .ipa is uploaded
    values = _effect(app_id).perform(attempt.context(ipa))

    # Then its identifiers were recorded before the upload existed, its id the moment it did
    assert uploads_at_record[:2] == [0, 1]
    assert set(attempt.records[0]) == {"app_id", "build_version", "build_number", "sha256"}
    (upload,) = service.connect.uploads.values()
    assert attempt.records[1]["upload_id"] == upload.id
    # And then Apple's state each time it changed, recorded and logged as it happened, up to VALID
    states = [record["apple_state"] for record in attempt.records[2:]]
    assert states[-1] == "VALID" and len(states) == len(set(states)) >= 2, states
    assert [line for line in attempt.lines if line.startswith(f"upload {upload.id}: ")] == [
        f"upload {upload.id}: {state}" for state in states
    ]
    # And it waited on the injected clock until the build was VALID
    assert values["apple_state"] == "VALID"
    assert (values["build_version"], values["build_number"], values["upload_id"]) == (
        "1.4.0",
        "42",
        upload.id,
    )
    assert values["sha256"] == service.connect.files[upload.file_ids[0]].sha256
    assert attempt.waited >= 360
    # And the probe now finds it DONE, with the same values
    found = _effect(app_id).probe(attempt.context(ipa), attempt.recorded)
    assert found.answer is Answer.DONE
    assert found.values == values


def test_without_waiting_for_processing_the_committed_upload_is_the_end(apple):
    service, _, app_id, attempt, ipa = apple
    # When the upload is made with wait_for_processing off
    values = _effect(app_id, wait_for_processing=False).perform(attempt.context(ipa))

    # Then it ends once committed, Apple still processing, without waiting
    assert values["apple_state"] == "PROCESSING"
    assert attempt.waits == []


def test_a_binary_plist_and_a_declared_version_that_agrees_are_read(apple, tmp_path):
    service, _, app_id, attempt, _ = apple
    # Given an .ipa whose Info.plist is binary, its version declared as it is
    ipa = tmp_path / "Bin.ipa"
    ipa.write_bytes(make_ipa("2.0", "7", fmt=plistlib.FMT_BINARY))

    # When it is uploaded
    values = _effect(app_id, file="Bin.ipa", version="2.0", build="7").perform(attempt.context(ipa))

    # Then the upload is of 2.0 (7)
    assert (values["build_version"], values["build_number"]) == ("2.0", "7")


def _refused(service, effect, context) -> str:
    with pytest.raises(EffectFailed) as failed:
        effect.perform(context)
    assert failed.value.error_class is ErrorClass.EFFECT_REFUSED, failed.value.message
    return failed.value.message


def test_a_missing_malformed_or_refused_key_is_refused_and_nothing_is_created(apple):
    service, _, app_id, attempt, ipa = apple
    # Given the key secret absent
    missing = Attempt({}, service)
    assert SECRET in _refused(service, _effect(app_id), missing.context(ipa))
    # Given the key without its private key
    broken = Attempt({SECRET: {**key_secret(new_key()), "private_key": "not a key"}}, service)
    assert "private_key" in _refused(service, _effect(app_id), broken.context(ipa))
    # Given a well-formed key Apple does not know (401 NOT_AUTHORIZED)
    stranger = Attempt({SECRET: key_secret(new_key(key_id="ZZZZ999999"))}, service)
    assert "refused the API key" in _refused(service, _effect(app_id), stranger.context(ipa))
    # Then nothing was created at Apple, and nothing recorded
    assert service.connect.uploads == {}
    assert missing.records == broken.records == stranger.records == []


def test_an_app_apple_does_not_know_is_refused_naming_it(apple):
    service, _, _, attempt, ipa = apple
    # When the upload names an app id the team has not
    message = _refused(service, _effect("999999"), attempt.context(ipa))

    # Then the refusal names the app, and nothing was created
    assert "no app 999999" in message
    assert service.connect.uploads == {}


@pytest.mark.parametrize(
    ("content", "named", "fields"),
    [
        (b"this is no zip", "is not a readable .ipa", {}),
        (b"zip-without-plist", "holds no Payload/<name>.app/Info.plist", {}),
        (make_ipa(build="4x2"), "CFBundleVersion is '4x2'", {}),
        (make_ipa(), "the declared build 43 is not the .ipa's 42", {"build": "43"}),
    ],
    # Named: an .ipa's bytes carry the time it was zipped, and xdist's workers must collect the same ids.
    ids=["not-a-zip", "no-info-plist", "bad-build-number", "declared-build-differs"],
)
def test_an_unreadable_or_disagreeing_ipa_is_refused_naming_what_is_wrong(apple, content, named, fields):
    service, _, app_id, attempt, ipa = apple
    # Given the file not an .ipa, without an Info.plist, with a bad build number, or not as declared
    if content == b"zip-without-plist":
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w") as archive:
            archive.writestr("Payload/App.app/App", b"binary")
        content = out.getvalue()
    ipa.write_bytes(content)

    # Then it is refused naming what is wrong, and nothing was created
    assert named in _refused(service, _effect(app_id, **fields), attempt.context(ipa))
    assert service.connect.uploads == {}


def test_a_pkg_takes_its_version_from_the_declaration_and_without_it_is_refused(apple, tmp_path):
    service, _, app_id, attempt, _ = apple
    pkg = tmp_path / "App.pkg"
    pkg.write_bytes(b"xar!" + bytes(range(256)) * 10)
    # When a .pkg is declared without its version, it is refused
    message = _refused(service, _effect(app_id, file="App.pkg", platform="MAC_OS"), attempt.context(pkg))
    assert "declare its version and build" in message
    # And with them it is uploaded as declared
    values = _effect(app_id, file="App.pkg", platform="MAC_OS", version="3.1", build="9").perform(
        attempt.context(pkg)
    )
    assert (values["build_version"], values["build_number"], values["apple_state"]) == ("3.1", "9", "VALID")
    assert next(iter(service.connect.uploads.values())).platform == "MAC_OS"


def test_a_build_number_already_used_by_another_file_is_refused_naming_the_next_free_one(apple):
    service, client, app_id, attempt, ipa = apple
    # Given 1.4.0 (42) and (44) uploaded from other files
    upload_build(client, app_id, make_ipa(filler=b"other"), build="42")
    upload_build(client, app_id, make_ipa(build="44", filler=b"other"), build="44")
    service.clock.advance(60)

    # When this 1.4.0 (42) is uploaded
    message = _refused(service, _effect(app_id), attempt.context(ipa))

    # Then it is refused, naming the next free build number, and no upload was added
    assert message == "build number 42 is already used for version 1.4.0; the next free one is 45"
    assert len(service.connect.uploads) == 2
    assert attempt.records == []


def test_this_jobs_build_number_used_at_apple_is_refused_naming_the_floor_to_set(apple):
    service, client, app_id, attempt, ipa = apple
    # Given 1.4.0 (42) and (44) uploaded outside Relevo, and this job given RELEVO_BUILD_NUMBER 42
    # (the .ipa's CFBundleVersion): the project's counter is behind the App Store's latest
    upload_build(client, app_id, make_ipa(filler=b"other"), build="42")
    upload_build(client, app_id, make_ipa(build="44", filler=b"other"), build="44")
    service.clock.advance(60)

    # When this 1.4.0 (42) is uploaded
    message = _refused(service, _effect(app_id), attempt.context(ipa, build_number=42))

    # Then the refusal names the floor to set and that only a new job takes a new number (every
    # retry and rerun of this one keeps 42), and nothing was added or recorded
    assert message == (
        "build number 42 is already used for version 1.4.0; the next free one is 45. It is this job's "
        "RELEVO_BUILD_NUMBER, which its retries and reruns keep: set the project's build_number.floor to "
        "45 (relevo project apply) and start a new job"
    )
    assert len(service.connect.uploads) == 2
    assert attempt.records == []


@pytest.mark.parametrize("fault", ["lose_answer", "gateway_timeout"])
@pytest.mark.parametrize("operation", [COMMIT, CREATE])
def test_an_answer_lost_after_the_create_or_commit_is_looked_for_not_repeated(apple, fault, operation):
    service, _, app_id, attempt, ipa = apple
    # Given the answer to the create or the commit lost, or a 504 from the edge, after it took effect
    getattr(service.faults, fault)(operation)

    # When the .ipa is uploaded
    values = _effect(app_id).perform(attempt.context(ipa))

    # Then the kind looked instead of repeating: one upload, VALID, and the probe agrees DONE
    assert service.faults.fired == [(operation, fault)]
    assert len(service.connect.uploads) == 1
    assert values["apple_state"] == "VALID"
    assert any("had no answer" in line for line in attempt.lines)
    assert _effect(app_id).probe(attempt.context(ipa), attempt.recorded).answer is Answer.DONE
    assert len(service.connect.uploads) == 1


def test_a_redundant_binary_failure_is_read_as_done_when_the_same_file_is_there(apple):
    service, client, app_id, attempt, ipa = apple
    # Given the same file landing at Apple as 1.4.0 (42) just after this attempt looked (an earlier
    # attempt's upload shown late), and Apple failing the second in processing with ITMS-90189
    service.faults.redundant_binary_in_processing()
    earlier: list[str] = []

    def land(_values):
        if not earlier:
            earlier.append(upload_build(client, app_id, ipa.read_bytes()))

    attempt.on_record = land

    # When the upload is made
    values = _effect(app_id).perform(attempt.context(ipa))

    # Then its own upload FAILED with ITMS-90189, and the stage ends with the earlier one, VALID
    failed = [u for u in service.connect.uploads.values() if u.errors]
    assert [code for code, _ in failed[0].errors] == ["ITMS-90189"]
    assert values["upload_id"] == earlier[0]
    assert values["apple_state"] == "VALID"
    assert any("ITMS-90189" in line for line in attempt.lines)


def test_a_build_apple_finds_invalid_is_rejected(apple):
    service, _, app_id, attempt, ipa = apple
    # Given processing armed to end INVALID
    service.connect.next_build_outcomes.append("INVALID")

    # When the upload is made, then the stage fails for good with Apple's state
    with pytest.raises(EffectFailed) as failed:
        _effect(app_id).perform(attempt.context(ipa))
    assert failed.value.error_class is ErrorClass.EFFECT_REJECTED
    assert "INVALID" in failed.value.message


def test_a_stopped_wait_is_probed_in_progress_and_resumed_without_a_second_upload(apple):
    service, _, app_id, attempt, ipa = apple
    # Given an attempt stopped while Apple was processing
    attempt.stop_when = lambda _attempt: True  # at its first wait
    with pytest.raises(EffectFailed) as stopped:
        _effect(app_id).perform(attempt.context(ipa))
    assert stopped.value.error_class is ErrorClass.AGENT_SHUTDOWN

    # When the next attempt probes what was recorded
    attempt.stop_when = lambda _attempt: False
    found = _effect(app_id).probe(attempt.context(ipa), attempt.recorded)

    # Then it is in progress, with the upload as evidence, and resuming waits for that one
    assert found.answer is Answer.IN_PROGRESS
    assert attempt.recorded["upload_id"] in found.evidence
    values = _effect(app_id).resume(attempt.context(ipa), attempt.recorded)
    assert values["apple_state"] == "VALID"
    assert len(service.connect.uploads) == 1


def test_an_attempt_dead_after_creating_is_resumed_by_sending_its_bytes(apple):
    service, _, app_id, attempt, ipa = apple

    # Given an attempt that died the moment it recorded its upload's id (no file, no bytes)
    def die(values):
        if "upload_id" in values:
            raise SystemExit("the Mac lost power")

    attempt.on_record = die
    with pytest.raises(SystemExit):
        _effect(app_id).perform(attempt.context(ipa))
    attempt.on_record = None

    # When the next attempt probes, then the upload is in progress (awaiting its bytes)
    found = _effect(app_id).probe(attempt.context(ipa), attempt.recorded)
    assert found.answer is Answer.IN_PROGRESS
    assert "AWAITING_UPLOAD" in found.evidence
    # And resuming sends and commits the bytes to that upload, and waits until VALID
    values = _effect(app_id).resume(attempt.context(ipa), attempt.recorded)
    assert values["apple_state"] == "VALID"
    assert len(service.connect.uploads) == 1


def test_the_probe_says_absent_when_nothing_is_at_apple(apple):
    service, _, app_id, attempt, ipa = apple
    # Given what an attempt records before it creates anything, and nothing created
    effect = _effect(app_id)
    binary_values = {"app_id": app_id, "build_version": "1.4.0", "build_number": "42"}

    # Then the probe is ABSENT, with those values or with none
    assert effect.probe(attempt.context(ipa), binary_values).answer is Answer.ABSENT
    assert effect.probe(attempt.context(ipa), {}).answer is Answer.ABSENT


def test_the_probe_cannot_tell_for_another_files_upload_a_refused_key_or_no_network(apple, tmp_path):
    service, client, app_id, attempt, ipa = apple
    recorded = {"app_id": app_id, "build_version": "1.4.0", "build_number": "42"}
    # Given 1.4.0 (42) at Apple from another file
    upload_build(client, app_id, make_ipa(filler=b"another"))
    other = _effect(app_id).probe(attempt.context(ipa), recorded)
    assert other.answer is Answer.CANNOT_TELL
    assert "another file's upload" in other.evidence
    # Given a key Apple refuses
    stranger = Attempt({SECRET: key_secret(new_key(key_id="ZZZZ999999"))}, service)
    refused = _effect(app_id).probe(stranger.context(ipa), recorded)
    assert (refused.answer, "401" in refused.evidence) == (Answer.CANNOT_TELL, True)
    # Given App Store Connect unreachable (nothing listens on the port)
    context = dataclasses.replace(
        attempt.context(ipa), endpoints=Endpoints(app_store_connect="http://127.0.0.1:9")
    )
    unreachable = _effect(app_id).probe(context, recorded)
    assert unreachable.answer is Answer.CANNOT_TELL


def test_the_next_free_build_number_is_the_highest_plus_one():
    assert next_free(["42", "9", "44"]) == "45"
    assert next_free(["1.2.9", "1.2.10"]) == "1.2.11"
    assert next_free([]) == "1"


def test_a_key_secrets_manager_does_not_have_is_refused_naming_its_error(apple):
    service, _, app_id, attempt, ipa = apple
    # Given Secrets Manager answering that the key's secret does not exist, as boto3 raises it
    from botocore.exceptions import ClientError

    def not_found(name):
        raise ClientError({"Error": {"Code": "ResourceNotFoundException", "Message": "no"}}, "GetSecretValue")

    context = dataclasses.replace(attempt.context(ipa), secret=not_found)

    # Then the upload is refused naming the secret and Secrets Manager's error, and nothing created
    message = _refused(service, _effect(app_id), context)
    assert SECRET in message and "ResourceNotFoundException" in message
    assert service.connect.uploads == {}


def test_processing_longer_than_the_time_left_ends_the_attempt_as_out_of_time(apple):
    service, _, app_id, attempt, ipa = apple
    # Given two minutes left of the stage's exec timeout, and processing taking six
    attempt.time_left_sec = 120

    # When the upload is made, then it stops waiting when the time is out, the upload processing
    with pytest.raises(EffectFailed) as failed:
        _effect(app_id).perform(attempt.context(ipa))
    assert failed.value.error_class is ErrorClass.EXEC_TIMEOUT
    assert attempt.waited == 120
    # And the next attempt's probe finds it in progress
    assert _effect(app_id).probe(attempt.context(ipa), attempt.recorded).answer is Answer.IN_PROGRESS
