"""The local Notary API and the bearer tokens of the local Apple service (relevo_local.apple,
issue 44): submissions kept with their status over the injected clock, the history of the 100
most recent, the documented fields enforced both ways, the notarization faults armed per test,
and every token Apple would refuse answered 401 NOT_AUTHORIZED. No real sleep: the clock moves."""

from __future__ import annotations

import hashlib

import httpx
import pytest

from tests.helpers.local_apple import local_apple, new_key

ZIP = b"PK\x05\x06" + b"release" * 1000
SHA = hashlib.sha256(ZIP).hexdigest()


@pytest.fixture
def apple():
    with local_apple() as (service, client):
        yield service, client


def _submit(client, name=f"Relevo-{SHA[:12]}-op-7f3a.zip", sha256=SHA):
    return client.post("/notary/v2/submissions", {"sha256": sha256, "submissionName": name})


def _upload(service, attributes, data=ZIP):
    """The file to the submission's bucket and object (Apple's S3; the service's stand-in here)."""
    url = f"{service.url}/s3/{attributes['bucket']}/{attributes['object']}"
    return httpx.put(url, content=data, headers={"x-amz-security-token": attributes["awsSessionToken"]})


def _status(client, submission_id):
    return client.get(f"/notary/v2/submissions/{submission_id}").json()["data"]["attributes"]["status"]


def test_a_submission_is_in_progress_until_uploaded_and_reviewed_then_accepted_with_its_log(apple):
    service, client = apple
    # When a submission is made
    created = _submit(client)

    # Then it has an id and the credentials for its upload, and is In Progress
    assert created.status_code == 200, created.text
    data = created.json()["data"]
    assert data["type"] == "newSubmissions"
    assert set(data["attributes"]) == {
        "awsAccessKeyId",
        "awsSecretAccessKey",
        "awsSessionToken",
        "bucket",
        "object",
    }
    assert _status(client, data["id"]) == "In Progress"
    assert client.get(f"/notary/v2/submissions/{data['id']}/logs").status_code == 404

    # When the file is uploaded, it stays In Progress for the review's three minutes
    assert _upload(service, data["attributes"]).status_code == 200
    service.clock.advance(179)
    assert _status(client, data["id"]) == "In Progress"

    # Then it is Accepted, and its log is there
    service.clock.advance(1)
    assert _status(client, data["id"]) == "Accepted"
    log_url = client.get(f"/notary/v2/submissions/{data['id']}/logs").json()["data"]["attributes"][
        "developerLogUrl"
    ]
    log = httpx.get(log_url).json()
    assert (log["status"], log["sha256"]) == ("Accepted", SHA)


def test_a_file_other_than_the_one_announced_is_invalid(apple):
    service, client = apple
    # Given a submission announced with one SHA-256, then another file uploaded
    data = _submit(client).json()["data"]
    _upload(service, data["attributes"], b"another file")

    # When the review is over, then it is Invalid
    service.clock.advance(180)
    assert _status(client, data["id"]) == "Invalid"


def test_the_upload_needs_the_submissions_own_session_token(apple):
    service, client = apple
    # Given a submission's credentials with another token
    attributes = _submit(client).json()["data"]["attributes"]

    # When the file is put with it, then it is refused
    assert _upload(service, {**attributes, "awsSessionToken": "guessed"}).status_code == 403


def test_a_request_with_a_field_the_documentation_does_not_name_is_refused_and_recorded(apple):
    service, client = apple
    # When a submission names its file as `name` (the status's field, not the request's)
    answer = client.post("/notary/v2/submissions", {"sha256": SHA, "name": "Relevo.zip"})

    # Then it is refused, naming both fields, nothing is kept, and the mismatch is on record
    assert answer.status_code == 400
    assert service.notary.submissions == {}
    (mismatch,) = service.take_mismatches()
    assert "body.submissionName: Field required" in mismatch
    assert "body.name: Extra inputs are not permitted" in mismatch


def test_a_submission_held_in_progress_stays_so_for_its_minutes(apple):
    service, client = apple
    # Given the next submission held In Progress for 90 minutes
    service.faults.hold_in_progress(minutes=90)
    data = _submit(client).json()["data"]
    _upload(service, data["attributes"])

    # When 89 minutes pass it is still In Progress; at 90 it is Accepted
    service.clock.advance(89 * 60)
    assert _status(client, data["id"]) == "In Progress"
    service.clock.advance(60)
    assert _status(client, data["id"]) == "Accepted"


def test_a_history_rolled_past_100_no_longer_lists_the_submission_but_its_id_still_answers(apple):
    service, client = apple
    # Given our submission, then 100 newer ones
    ours = _submit(client).json()["data"]["id"]
    service.clock.advance(1)
    service.faults.roll_history(100)

    # When the history is read, then it holds the 100 most recent, newest first, not ours
    history = client.get("/notary/v2/submissions").json()["data"]
    assert len(history) == 100
    assert ours not in {s["id"] for s in history}
    assert history == sorted(history, key=lambda s: s["attributes"]["createdDate"], reverse=True)
    # And asked by its id, it answers
    assert _status(client, ours) == "In Progress"


def test_the_answer_lost_after_a_submission_leaves_it_in_the_history(apple):
    service, client = apple
    # Given the submission's answer armed to be lost
    service.faults.lose_answer("submitSoftware")

    # When a submission is made, the client hears nothing
    with pytest.raises(httpx.RemoteProtocolError):
        _submit(client)

    # Then the submission exists, found in the history by its name
    named = [
        s for s in client.get("/notary/v2/submissions").json()["data"] if SHA[:12] in s["attributes"]["name"]
    ]
    assert len(named) == 1


def test_a_504_after_a_submission_was_made(apple):
    service, client = apple
    # Given the submission's answer armed to be a 504
    service.faults.gateway_timeout("submitSoftware")

    # When a submission is made, then the client sees a 504 and the submission exists
    assert _submit(client).status_code == 504
    assert len(service.notary.submissions) == 1


def _refused_tokens(service, key):
    now = service.clock.now().timestamp()
    stranger = new_key()  # the same issuer and key id, another private key
    return {
        "no token": None,
        "not a JWT": "Bearer not-a-token",
        "another key's signature": f"Bearer {stranger.token(now)}",
        "expired": f"Bearer {key.token(now - 30 * 60)}",
        "more than 20 minutes ahead": f"Bearer {key.token(now, lifetime=21 * 60)}",
        "another audience": f"Bearer {key.token(now, aud='appstoreconnect-v2')}",
        "an unknown key id": f"Bearer {new_key(key_id='UNKNOWN123').token(now)}",
        "another issuer": f"Bearer {new_key(issuer='someone-else').token(now)}",
    }


@pytest.mark.parametrize("path", ["/v1/apps", "/notary/v2/submissions"])
def test_every_token_apple_would_refuse_is_answered_401(apple, path):
    service, client = apple
    # Given tokens that are missing, malformed, forged, expired, too long-lived, or not for this API
    for why, authorization in _refused_tokens(service, client.key).items():
        headers = {} if authorization is None else {"Authorization": authorization}

        # When each is used, then the answer is 401 NOT_AUTHORIZED, and the service says why
        answer = client.http.get(path, headers=headers)
        assert answer.status_code == 401, why
        assert answer.json()["errors"][0]["code"] == "NOT_AUTHORIZED", why
    assert len(service.refusals) == 8
    # And a good token passes
    assert client.get(path).status_code == 200


def test_a_request_for_another_host_is_refused(apple):
    service, client = apple
    # When a request names another host (a page rebinding its DNS to loopback), then it is refused
    answer = client.http.get("/v1/apps", headers={**client.headers(), "Host": "evil.example"})
    assert answer.status_code == 421
