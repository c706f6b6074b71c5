"""The github_release_asset effect (relevo_agent.effects.github_release_asset, issue 44) against a
stateful stand-in for GitHub's releases (local/relevo_local/github/releases.py) whose every request and
answer is checked against GitHub's pinned REST description: identifiers recorded before anything is
sent, each probe answer, the upload whose answer was lost (found, never sent twice), an asset of
that name with other bytes never overwritten, an unfinished upload deleted and redone in the log,
and the token refused, cut off or led elsewhere. No real sleep: nothing here waits."""

from __future__ import annotations

import hashlib

import pytest

from relevo_agent.effects.github_release_asset import GithubReleaseAssetEffect
from relevo_agent.effects.kind import Answer, EffectFailed, Endpoints
from relevo_core.models.effect import GithubReleaseAsset
from relevo_core.models.errors import ErrorClass
from relevo_local.github.releases import TOKEN, github_releases
from tests.helpers.effect_context import Attempt
from tests.helpers.recorder import Recorder

SECRET = "relevo/test/_release/app/github-token"
ZIP = b"PK\x05\x06" + b"release-asset" * 500
SHA = hashlib.sha256(ZIP).hexdigest()
REPOSITORY = "acme/app"
TAG = "v1.4.0"


@pytest.fixture
def github():
    with github_releases() as responder:
        yield responder


@pytest.fixture
def workspace(tmp_path):
    (tmp_path / "dist").mkdir()
    (tmp_path / "dist" / "App.zip").write_bytes(ZIP)
    return tmp_path


def _effect(**overrides):
    fields = {
        "kind": "github_release_asset",
        "file": "dist/App.zip",
        "repository": REPOSITORY,
        "tag": TAG,
        "token": SECRET,
        **overrides,
    }
    return GithubReleaseAssetEffect(GithubReleaseAsset(**fields))


def _context(github, workspace, attempt=None, secret=None):
    attempt = attempt or Attempt(secrets={SECRET: secret if secret is not None else {"token": TOKEN}})
    endpoints = Endpoints(github=github.url)
    return attempt, attempt.context(workspace / "dist" / "App.zip", endpoints=endpoints, workspace=workspace)


def _assert_no_token(attempt, *texts):
    for text in [*attempt.lines, *texts, repr(attempt.recorded)]:
        assert TOKEN not in text


def test_perform_records_its_identifiers_before_any_request_then_uploads_the_file(github, workspace):
    # Given a release for the tag, without the asset
    release = github.add_release(REPOSITORY, TAG)
    attempt, context = _context(github, workspace)
    sent_before_record = []
    attempt.on_record = lambda _values: sent_before_record.append(len(github.requests))

    # When the effect is performed
    values = _effect().perform(context)

    # Then its identifiers were recorded before GitHub heard anything
    assert sent_before_record == [0]
    assert attempt.records[0] == {
        "sha256": SHA,
        "asset_name": "App.zip",
        "tag": TAG,
        "repository": REPOSITORY,
    }
    # And the file was uploaded once, as a zip, under its name, to the release's upload_url
    (upload,) = github.uploads()
    assert upload.path == f"/repos/acme/app/releases/{release.id}/assets"
    assert upload.query == {"name": "App.zip"}
    assert upload.headers["content-type"] == "application/zip"
    assert upload.body == ZIP
    (asset,) = release.assets
    assert values == {
        "sha256": SHA,
        "asset_name": "App.zip",
        "tag": TAG,
        "repository": REPOSITORY,
        "asset_id": str(asset.id),
        "asset_url": f"https://github.com/acme/app/releases/download/{TAG}/App.zip",
    }
    _assert_no_token(attempt)


def test_probe_is_done_for_the_asset_with_the_files_digest_and_resume_sends_nothing(github, workspace):
    # Given the asset already on the release with this file's bytes
    release = github.add_release(REPOSITORY, TAG)
    asset = github.add_asset(release, "App.zip", ZIP)
    attempt, context = _context(github, workspace)

    # When it is probed with what the previous attempt recorded
    answer = _effect().probe(context, {"sha256": SHA, "asset_name": "App.zip"})

    # Then it is done, with the asset's id and download address
    assert answer.answer is Answer.DONE
    assert answer.values["asset_id"] == str(asset.id)
    assert answer.values["asset_url"].endswith(f"/releases/download/{TAG}/App.zip")
    assert SHA in answer.evidence
    # And resuming leaves the same values and uploads nothing
    assert _effect().resume(context, {"sha256": SHA}) == dict(answer.values)
    assert github.uploads() == []


def test_probe_is_absent_without_the_asset_or_without_the_release_and_resume_then_uploads(github, workspace):
    attempt, context = _context(github, workspace)
    # Given no release for the tag: absent
    assert _effect().probe(context, {}).answer is Answer.ABSENT

    # Given the release with other assets but not this one: absent
    release = github.add_release(REPOSITORY, TAG)
    github.add_asset(release, "App.dSYM.zip", b"symbols")
    answer = _effect().probe(context, {})
    assert (answer.answer, answer.values) == (Answer.ABSENT, {})

    # When resumed, it is uploaded (GitHub keeps no upload under way)
    values = _effect().resume(context, {})
    assert len(github.uploads()) == 1
    assert values["asset_id"] == str(release.assets[-1].id)


def test_probe_finds_the_asset_past_the_first_page_of_assets(github, workspace):
    # Given a release with 150 assets, this one the last
    release = github.add_release(REPOSITORY, TAG)
    for n in range(149):
        github.add_asset(release, f"part-{n}.zip", b"x")
    github.add_asset(release, "App.zip", ZIP)
    _, context = _context(github, workspace)

    # When probed, then it is found on the second page
    assert _effect().probe(context, {}).answer is Answer.DONE
    pages = [r.query.get("page") for r in github.requests if r.path.endswith("/assets")]
    assert pages == ["1", "2"]


def test_the_upload_whose_answer_was_lost_is_found_by_the_probe_and_never_sent_twice(github, workspace):
    # Given a release, and GitHub's answer to the upload lost after the asset was stored
    release = github.add_release(REPOSITORY, TAG)
    github.lose_upload_answers()
    attempt, context = _context(github, workspace)

    # When the effect is performed, then the attempt fails as a transient network failure
    with pytest.raises(EffectFailed) as failed:
        _effect().perform(context)
    assert failed.value.error_class is ErrorClass.CONNECTION_RESET
    assert failed.value.error_class.retryable

    # When the next attempt probes with what was recorded, then the asset is there: done
    answer = _effect().probe(context, attempt.recorded)
    assert answer.answer is Answer.DONE
    assert answer.values["asset_id"] == str(release.assets[0].id)
    # And performing again (a retry that did not probe) finds it and sends nothing more
    assert _effect().perform(context)["asset_id"] == str(release.assets[0].id)
    assert len(github.uploads()) == 1
    assert len(release.assets) == 1


def test_an_asset_of_that_name_with_other_bytes_is_never_overwritten(github, workspace):
    # Given the release holds an App.zip with other bytes
    release = github.add_release(REPOSITORY, TAG)
    other = github.add_asset(release, "App.zip", b"an older build")
    attempt, context = _context(github, workspace)

    # When probed, then it cannot tell (manual review), naming both digests
    answer = _effect().probe(context, {})
    assert answer.answer is Answer.CANNOT_TELL
    assert other.digest in answer.evidence and SHA in answer.evidence

    # When performed, then it is refused, nothing uploaded and nothing deleted
    with pytest.raises(EffectFailed) as refused:
        _effect().perform(context)
    assert refused.value.error_class is ErrorClass.EFFECT_REFUSED
    assert "never overwritten" in refused.value.message
    assert github.uploads() == []
    assert [r for r in github.requests if r.method == "DELETE"] == []
    assert release.assets == [other]

    # And resume, asked anyway, sends it to manual review
    with pytest.raises(EffectFailed) as review:
        _effect().resume(context, {})
    assert review.value.error_class is ErrorClass.MANUAL_REVIEW


def test_an_asset_of_that_name_without_a_digest_is_cannot_tell_and_refused(github, workspace):
    # Given an App.zip with the same bytes, from before GitHub gave assets a digest
    release = github.add_release(REPOSITORY, TAG)
    github.add_asset(release, "App.zip", ZIP, digested=False)
    _, context = _context(github, workspace)

    # When probed, then it cannot tell: nothing proves it is this file
    answer = _effect().probe(context, {})
    assert answer.answer is Answer.CANNOT_TELL and "no digest" in answer.evidence

    # When performed, then it is refused and nothing is uploaded
    with pytest.raises(EffectFailed) as refused:
        _effect().perform(context)
    assert refused.value.error_class is ErrorClass.EFFECT_REFUSED
    assert github.uploads() == []


def test_an_unfinished_upload_is_absent_then_deleted_in_the_log_and_uploaded_again(github, workspace):
    # Given an App.zip left by an upload that did not finish (no digest, state not `uploaded`)
    release = github.add_release(REPOSITORY, TAG)
    leftover = github.add_asset(release, "App.zip", b"", state="open")
    attempt, context = _context(github, workspace)

    # When probed, then it is absent, the leftover named
    answer = _effect().probe(context, {})
    assert answer.answer is Answer.ABSENT
    assert str(leftover.id) in answer.evidence and "open" in answer.evidence
    assert [r.method for r in github.requests if r.method != "GET"] == []

    # When performed, then the leftover is deleted, said in the log, and the file uploaded
    values = _effect().perform(context)
    deletes = [r.path for r in github.requests if r.method == "DELETE"]
    assert deletes == [f"/repos/acme/app/releases/assets/{leftover.id}"]
    assert any(f"deleting asset {leftover.id}" in line for line in attempt.lines)
    (asset,) = release.assets
    assert asset.digest == f"sha256:{SHA}"
    assert values["asset_id"] == str(asset.id)


def test_an_upload_answered_502_that_left_an_unfinished_asset_is_redone_by_the_retry(github, workspace):
    # Given GitHub answers the upload 502 and leaves an empty asset of that name behind
    release = github.add_release(REPOSITORY, TAG)
    github.fail_uploads_unfinished()
    attempt, context = _context(github, workspace)

    # When performed, then the attempt fails as transient
    with pytest.raises(EffectFailed) as failed:
        _effect().perform(context)
    assert failed.value.error_class.retryable
    (leftover,) = release.assets
    assert leftover.state != "uploaded"

    # When the retry probes, then it is absent; and its perform deletes the leftover and uploads
    assert _effect().probe(context, attempt.recorded).answer is Answer.ABSENT
    values = _effect().perform(context)
    (asset,) = release.assets
    assert (asset.digest, values["asset_id"]) == (f"sha256:{SHA}", str(asset.id))
    assert len(github.uploads()) == 2


def test_a_token_github_refuses_is_refused_by_perform_and_cannot_tell_by_probe(github, workspace):
    # Given a release, and a token GitHub answers 401 to
    release = github.add_release(REPOSITORY, TAG)
    attempt, context = _context(github, workspace, secret={"token": "ghs_revoked"})

    # When performed, then it is refused for good and nothing is uploaded
    with pytest.raises(EffectFailed) as refused:
        _effect().perform(context)
    assert refused.value.error_class is ErrorClass.EFFECT_REFUSED
    assert "401" in refused.value.message and "ghs_revoked" not in refused.value.message
    assert github.uploads() == [] and release.assets == []

    # When probed, then it cannot tell
    answer = _effect().probe(context, {})
    assert answer.answer is Answer.CANNOT_TELL and "401" in answer.evidence


def test_a_bare_token_secret_or_one_without_a_token_is_refused_before_anything_is_sent(github, workspace):
    github.add_release(REPOSITORY, TAG)
    # Given the token stored bare (not a JSON object): the agent reads release keys as JSON objects
    # only (relevo_agent.effects.agent_side.ReleaseKeys), so it is refused naming the key, not its text
    _, context = _context(github, workspace, secret=TOKEN)
    with pytest.raises(EffectFailed) as bare:
        _effect().perform(context)
    assert (bare.value.error_class, bare.value.message) == (
        ErrorClass.EFFECT_REFUSED,
        f"the key {SECRET} is not a JSON object",
    )
    assert github.requests == []

    # Given a secret with no token: refused before anything is sent, naming the secret, not its value
    sent = len(github.requests)
    attempt, context = _context(github, workspace, secret={"user": "release-bot", "note": "s3cr3t-value"})
    with pytest.raises(EffectFailed) as refused:
        _effect().perform(context)
    assert refused.value.error_class is ErrorClass.EFFECT_REFUSED
    assert SECRET in refused.value.message and "s3cr3t-value" not in refused.value.message
    assert len(github.requests) == sent


def test_the_network_cut_is_cannot_tell_for_the_probe_and_transient_for_perform(github, workspace):
    # Given a release, and every connection to GitHub cut
    github.add_release(REPOSITORY, TAG)
    github.cut = True
    attempt, context = _context(github, workspace)

    # When probed, then it cannot tell (and does not raise)
    answer = _effect().probe(context, {"sha256": SHA})
    assert answer.answer is Answer.CANNOT_TELL

    # When performed, then it fails as transient, after recording its identifiers
    with pytest.raises(EffectFailed) as failed:
        _effect().perform(context)
    assert failed.value.error_class.retryable
    assert attempt.records[0]["sha256"] == SHA


def test_a_server_error_is_transient_for_perform_and_cannot_tell_for_the_probe(github, workspace):
    github.add_release(REPOSITORY, TAG)
    attempt, context = _context(github, workspace)
    # Given GitHub answers 502 to the next request
    github.answer_status(502)
    assert _effect().probe(context, {}).answer is Answer.CANNOT_TELL
    github.answer_status(502)
    with pytest.raises(EffectFailed) as failed:
        _effect().perform(context)
    assert failed.value.error_class is ErrorClass.STORAGE_5XX


def test_no_release_for_the_tag_is_refused(github, workspace):
    # Given the repository has no release for the tag
    github.add_release(REPOSITORY, "v1.3.9")
    _, context = _context(github, workspace)

    # When performed, then it is refused, naming the tag, and nothing uploaded
    with pytest.raises(EffectFailed) as refused:
        _effect().perform(context)
    assert refused.value.error_class is ErrorClass.EFFECT_REFUSED
    assert f"no release for tag {TAG}" in refused.value.message
    assert github.uploads() == []


def test_an_upload_url_elsewhere_is_refused_and_the_token_never_leaves(github, workspace):
    # Given GitHub's release answer names an upload_url on another host
    elsewhere = Recorder().start()
    try:
        github.upload_origin = elsewhere.url
        github.add_release(REPOSITORY, TAG)
        _, context = _context(github, workspace)

        # When performed, then it is refused and the other host heard nothing
        with pytest.raises(EffectFailed) as refused:
            _effect().perform(context)
        assert refused.value.error_class is ErrorClass.EFFECT_REFUSED
        assert "upload_url" in refused.value.message
        assert elsewhere.received() == []
        assert github.uploads() == []
    finally:
        elsewhere.stop()


@pytest.mark.parametrize("tag", ["../../../user", "v1/../../x", "v1 2", ".hidden", "v1:2"])
def test_a_tag_that_is_no_git_tag_name_is_refused_before_any_request(github, workspace, tag):
    _, context = _context(github, workspace)
    # When performed with it, then it is refused and GitHub heard nothing
    with pytest.raises(EffectFailed) as refused:
        _effect(tag=tag).perform(context)
    assert refused.value.error_class is ErrorClass.EFFECT_REFUSED
    assert github.requests == []


@pytest.mark.parametrize("name", ["My App.zip", ".App.zip", "App.zip.", "App+1.zip", "Äpp.zip"])
def test_an_asset_name_github_would_rename_is_refused_before_any_request(github, workspace, name):
    # Given a name GitHub would rename (then never found by it again: a second upload)
    github.add_release(REPOSITORY, TAG)
    _, context = _context(github, workspace)
    # When performed, then it is refused, naming `name:`, and GitHub heard nothing
    with pytest.raises(EffectFailed) as refused:
        _effect(name=name).perform(context)
    assert refused.value.error_class is ErrorClass.EFFECT_REFUSED
    assert "name:" in refused.value.message
    assert github.requests == []
