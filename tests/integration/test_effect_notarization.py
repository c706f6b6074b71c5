"""The notarization kind (relevo_agent.effects.notarization) against the local Notary API (issue 44):
perform records before it acts and shows the submission id at once, waits for Apple's decision
on the service's injected clock (no real sleep), staples through a recorded double of `xcrun
stapler`; the probe's four answers, by the recorded id or by the name in the history; resume
waits and never submits; the faults of the field (a submission held In Progress, the answer
lost, a history rolled past 100, Invalid with its log) and bad input refused before anything is
submitted. The fixture asserts every request matched the Notary API's documented fields."""

from __future__ import annotations

import hashlib

import pytest

from relevo_agent.effects.kind import Answer, EffectFailed, Endpoints
from relevo_agent.effects.notarization import NotarizationEffect, submission_name
from relevo_core.models.effect import Notarization
from relevo_core.models.errors import ErrorClass
from relevo_local.apple.notary import NewSubmissionRequest
from tests.helpers import stapler_double
from tests.helpers.effect_context import Attempt, key_secret
from tests.helpers.local_apple import local_apple, new_key

KEY = "relevo/local/_release/app/notary-key"
OPERATION = "job_0123456789abcdefghij:notarize"
DMG = b"koly" + b"signed disk image" * 4000
ZIP = b"PK\x05\x06" + b"release" * 1000


@pytest.fixture
def apple():
    with local_apple() as (service, client):
        yield service, client


@pytest.fixture
def stapler(tmp_path):
    return stapler_double.install(tmp_path / "bin")


def _effect(stapler, file="dist/Relevo-1.4.dmg", staple=True, poll_sec=30):
    spec = Notarization(kind="notarization", file=file, api_key=KEY, staple=staple)
    return NotarizationEffect(spec, stapler=[str(stapler)] if stapler else None, poll_sec=poll_sec)


def _file(tmp_path, name="Relevo-1.4.dmg", data=DMG):
    path = tmp_path / "workspace" / "dist" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def _context(apple, file, trace=None, secrets=None, notary=None):
    service, client = apple
    trace = trace or Attempt()
    trace.service = service
    trace.secrets = {KEY: key_secret(client.key)} if secrets is None else secrets
    endpoints = Endpoints(notary=notary) if notary else None
    return trace.context(file, OPERATION, endpoints), trace


def _effect_for(stapler, service, file="dist/Relevo-1.4.dmg", staple=True, poll_sec=30):
    effect = _effect(stapler, file, staple, poll_sec)
    effect.upload_endpoint = f"{service.url}/s3"
    return effect


# -- perform -------------------------------------------------------------------------------------


def test_perform_records_before_submitting_shows_the_id_uploads_waits_and_staples(apple, tmp_path, stapler):
    service, _ = apple
    # Given a signed .dmg in the workspace
    file = _file(tmp_path)
    sha = hashlib.sha256(DMG).hexdigest()
    context, trace = _context(apple, file)
    effect = _effect_for(stapler, service)

    # When the effect is performed
    values = effect.perform(context)

    # Then the name and sha256 were recorded first, then the id, then the upload
    name = submission_name(file, sha, OPERATION)
    assert name == f"Relevo-1.4.{sha[:16]}.job_0123456789abcdefghij.notarize.dmg"
    (submission,) = service.notary.submissions.values()
    assert trace.records == [
        {"sha256": sha, "submission_name": name},
        {"submission_id": submission.id},
        {"uploaded": "true"},
        # Then Apple's status each time it changed, as it happened (the stage shows it while it waits)
        {"apple_state": "In Progress"},
        {"apple_state": "Accepted"},
    ]
    assert [line for line in trace.lines if line.endswith((" is In Progress", " is Accepted"))] == [
        f"notarization: submission {submission.id} is In Progress",
        f"notarization: submission {submission.id} is Accepted",
    ]
    # And the id was shown as soon as it existed, before the file went up
    made = next(i for i, line in enumerate(trace.lines) if submission.id in line and "made" in line)
    assert made < next(i for i, line in enumerate(trace.lines) if "uploaded" in line)
    # And Apple has exactly one submission, of this file, accepted after its review
    assert (submission.name, submission.sha256, submission.received_sha256) == (name, sha, sha)
    assert values == {
        "submission_id": submission.id,
        "submission_name": name,
        "sha256": sha,
        "apple_state": "Accepted",
        "stapled": "true",
    }
    assert 180 <= trace.waited <= 210
    # And neither the key nor a token is in what it logged or recorded
    shown = " ".join(trace.lines) + repr(trace.records) + repr(values)
    secret = key_secret(apple[1].key)["private_key"]
    assert secret.splitlines()[1] not in shown and "eyJ" not in shown
    # And the ticket was stapled after a validate that found none
    assert stapler_double.calls(stapler) == [["validate", str(file)], ["staple", str(file)]]


def test_a_zip_is_notarized_and_not_stapled_and_the_log_says_why(apple, tmp_path, stapler):
    service, _ = apple
    # Given a .zip
    file = _file(tmp_path, "Relevo-1.4.zip", ZIP)
    context, trace = _context(apple, file)

    # When it is notarized with staple left on
    values = _effect_for(stapler, service, "dist/Relevo-1.4.zip").perform(context)

    # Then it is accepted, the stapler never runs, and the log says a .zip cannot be stapled
    assert (values["apple_state"], values["stapled"]) == ("Accepted", "false")
    assert stapler_double.calls(stapler) == []
    assert any("cannot be stapled" in line for line in trace.lines)
    # And probed, it is done as it is, unstapled
    probed = _effect_for(stapler, service, "dist/Relevo-1.4.zip").probe(context, trace.recorded)
    assert (probed.answer, probed.values["stapled"]) == (Answer.DONE, "false")
    assert stapler_double.calls(stapler) == []


def test_a_file_that_already_carries_its_ticket_is_not_stapled_again(apple, tmp_path, stapler):
    service, _ = apple
    # Given a file notarized and stapled once
    file = _file(tmp_path)
    context, trace = _context(apple, file)
    effect = _effect_for(stapler, service)
    effect.perform(context)

    # When the submission is resumed on the same Mac (an operator chose to resume it)
    values = effect.resume(_context(apple, file)[0], trace.recorded)

    # Then validate found the ticket, staple did not run a second time, and nothing was submitted
    assert values["stapled"] == "true"
    assert [call[0] for call in stapler_double.calls(stapler)] == ["validate", "staple", "validate"]
    assert len(service.notary.submissions) == 1


def test_a_failed_staple_is_retried_by_stapling_never_by_submitting_again(apple, tmp_path, stapler):
    service, _ = apple
    # Given a stapler that cannot fetch the ticket yet (Apple's ticket not yet published)
    stapler_double.fail_staple(stapler)
    file = _file(tmp_path)
    context, trace = _context(apple, file)
    effect = _effect_for(stapler, service)

    # When the file is notarized, the stage fails retryably, saying Apple accepted it
    with pytest.raises(EffectFailed) as failed:
        effect.perform(context)
    assert failed.value.error_class.retryable
    assert "Apple accepted the file" in failed.value.message

    # Then the retry's probe finds it Accepted and the file without its ticket: in progress
    (stapler.parent / "stapler-state" / "fail").unlink()
    retry, _ = _context(apple, file)
    answer = effect.probe(retry, trace.recorded)
    assert answer.answer is Answer.IN_PROGRESS
    assert "not yet stapled" in answer.evidence

    # And resume staples it, with the one submission; probed again, it is done
    values = effect.resume(retry, trace.recorded)
    assert (values["apple_state"], values["stapled"]) == ("Accepted", "true")
    assert len(service.notary.submissions) == 1
    done = effect.probe(retry, trace.recorded)
    assert (done.answer, done.values["stapled"]) == (Answer.DONE, "true")


@pytest.mark.parametrize("outcome", ["Invalid", "Rejected"])
def test_a_submission_apple_turns_down_fails_for_good_with_its_log(apple, tmp_path, stapler, outcome):
    service, _ = apple
    # Given Apple will turn the next submission down
    service.notary.next_outcomes.append(outcome)
    file = _file(tmp_path)
    context, trace = _context(apple, file)

    # When it is performed
    with pytest.raises(EffectFailed) as failed:
        _effect_for(stapler, service).perform(context)

    # Then it fails as rejected (not retried), with Apple's state, and nothing stapled
    assert failed.value.error_class is ErrorClass.EFFECT_REJECTED
    assert outcome in failed.value.message
    assert "Not accepted" in failed.value.message
    if outcome == "Invalid":  # the issues of Apple's log
        assert "The signature of the binary is invalid." in failed.value.message
    assert trace.recorded["apple_state"] == outcome
    assert stapler_double.calls(stapler) == []


def test_a_dropped_status_poll_is_not_read_as_a_decision(apple, tmp_path, stapler):
    service, _ = apple
    # Given two status polls whose answers are lost
    service.faults.lose_answer("getSubmissionStatus", times=2)
    file = _file(tmp_path)
    context, trace = _context(apple, file)

    # When it is performed
    values = _effect_for(stapler, service).perform(context)

    # Then it kept asking and ends Accepted, with one submission
    assert values["apple_state"] == "Accepted"
    assert len(service.notary.submissions) == 1
    assert sum("not read" in line for line in trace.lines) == 1


# -- held In Progress: timeout, stop, probe, resume ----------------------------------------------


def test_held_in_progress_past_the_stages_time_fails_to_be_retried_and_the_retry_resumes(
    apple, tmp_path, stapler
):
    service, _ = apple
    # Given the submission held In Progress for 90 minutes, and a stage of 30 minutes
    service.faults.hold_in_progress(minutes=90)
    file = _file(tmp_path)
    context, trace = _context(apple, file, trace=Attempt(time_left_sec=30 * 60))
    effect = _effect_for(stapler, service, poll_sec=120)

    # When it is performed, the stage's time runs out: a retryable failure
    with pytest.raises(EffectFailed) as failed:
        effect.perform(context)
    assert failed.value.error_class.retryable
    assert "never submits again" in failed.value.message

    # Then the retry's probe finds it In Progress by its recorded id
    retry, retry_trace = _context(apple, file, trace=Attempt(time_left_sec=90 * 60))
    answer = effect.probe(retry, trace.recorded)
    assert answer.answer is Answer.IN_PROGRESS
    assert answer.values["submission_id"] == trace.recorded["submission_id"]

    # And resume waits for it to be Accepted and staples, with exactly one submission at Apple
    values = effect.resume(retry, trace.recorded)
    assert values["apple_state"] == "Accepted"
    assert len(service.notary.submissions) == 1
    # The recorded id was kept: only Apple's status is recorded, each time it changed
    assert retry_trace.records == [{"apple_state": "In Progress"}, {"apple_state": "Accepted"}]
    assert stapler_double.calls(stapler)[-1] == ["staple", str(file)]


def test_an_attempt_stopped_while_in_progress_is_resumed_never_resubmitted(apple, tmp_path, stapler):
    service, _ = apple
    # Given the submission held In Progress, and the attempt stopped after ten minutes of waiting
    service.faults.hold_in_progress(minutes=20)
    file = _file(tmp_path)
    context, trace = _context(apple, file, trace=Attempt(stop_when=lambda t: t.waited >= 600))
    effect = _effect_for(stapler, service)

    with pytest.raises(EffectFailed) as failed:
        effect.perform(context)
    assert failed.value.error_class is ErrorClass.AGENT_SHUTDOWN

    # When another attempt probes and resumes
    retry, _ = _context(apple, file)
    assert effect.probe(retry, trace.recorded).answer is Answer.IN_PROGRESS
    values = effect.resume(retry, trace.recorded)

    # Then the one submission is Accepted
    assert values["apple_state"] == "Accepted"
    (submission,) = service.notary.submissions.values()
    assert values["submission_id"] == submission.id


# -- the probe's answers -------------------------------------------------------------------------


def test_probe_done_by_the_recorded_id_and_by_the_name_in_the_history(apple, tmp_path, stapler):
    service, _ = apple
    # Given a notarization done
    file = _file(tmp_path)
    context, trace = _context(apple, file)
    effect = _effect_for(stapler, service)
    effect.perform(context)

    # When it is probed by its id, then it is done with the values perform left
    by_id = effect.probe(context, trace.recorded)
    assert by_id.answer is Answer.DONE
    assert by_id.values["submission_id"] == trace.recorded["submission_id"]
    assert (by_id.values["apple_state"], by_id.values["stapled"]) == ("Accepted", "true")

    # And with the id lost (only the name and sha256 recorded), the history finds it: done
    by_name = effect.probe(context, {k: trace.recorded[k] for k in ("sha256", "submission_name")})
    assert by_name.answer is Answer.DONE
    assert by_name.values["submission_id"] == trace.recorded["submission_id"]


def test_probe_absent_when_nothing_was_recorded_and_the_history_is_not_full(apple, tmp_path, stapler):
    service, _ = apple
    # Given other submissions of the team, fewer than 100, and none of this operation
    service.notary.add_past(40)
    file = _file(tmp_path)
    context, _ = _context(apple, file)

    # When an attempt that died before recording anything is probed
    answer = _effect_for(stapler, service).probe(context, {})

    # Then it is absent: run again under the same operation id
    assert answer.answer is Answer.ABSENT


def test_probe_cannot_tell_when_the_name_may_have_rolled_out_of_a_full_history(apple, tmp_path, stapler):
    service, _ = apple
    # Given the name and sha256 recorded (the id's answer never came) and 100 newer submissions
    file = _file(tmp_path)
    sha = hashlib.sha256(DMG).hexdigest()
    recorded = {"sha256": sha, "submission_name": submission_name(file, sha, OPERATION)}
    service.faults.roll_history(100)
    context, _ = _context(apple, file)

    # When it is probed
    answer = _effect_for(stapler, service).probe(context, recorded)

    # Then it cannot tell (not absent: the submission may have rolled out of the 100)
    assert answer.answer is Answer.CANNOT_TELL
    assert "rolled out" in answer.evidence


@pytest.mark.parametrize("fault", ["lose_answer", "gateway_timeout"])
def test_the_lost_answer_of_a_submission_is_found_by_name_and_never_submitted_again(
    apple, tmp_path, stapler, fault
):
    service, _ = apple
    # Given the submission's answer lost after Apple made it (no answer at all, or a 504 from the edge)
    getattr(service.faults, fault)("submitSoftware")
    file = _file(tmp_path)
    context, trace = _context(apple, file)
    effect = _effect_for(stapler, service)

    # When it is performed, it fails retryably with no id recorded
    with pytest.raises(EffectFailed) as failed:
        effect.perform(context)
    assert failed.value.error_class.retryable
    assert "submission_id" not in trace.recorded

    # Then the retry's probe finds it by its name in the history, with its id
    (submission,) = service.notary.submissions.values()
    answer = effect.probe(_context(apple, file)[0], trace.recorded)
    assert answer.values["submission_id"] == submission.id
    # And, its file never uploaded (its credentials were in the lost answer), it cannot tell rather
    # than wait for what Apple will never finish, or submit a second time
    assert answer.answer is Answer.CANNOT_TELL
    assert "never finish" in answer.evidence
    # And a resume asked to wait for it refuses for a person to decide, submitting nothing
    with pytest.raises(EffectFailed) as resumed:
        effect.resume(_context(apple, file)[0], trace.recorded)
    assert resumed.value.error_class is ErrorClass.MANUAL_REVIEW
    assert len(service.notary.submissions) == 1


@pytest.mark.parametrize("outcome", ["Invalid", "Rejected"])
def test_probe_of_a_submission_turned_down_cannot_tell_and_shows_apples_state(
    apple, tmp_path, stapler, outcome
):
    service, _ = apple
    # Given a notarization Apple turned down, its failure never reported
    service.notary.next_outcomes.append(outcome)
    file = _file(tmp_path)
    context, trace = _context(apple, file)
    effect = _effect_for(stapler, service)
    with pytest.raises(EffectFailed):
        effect.perform(context)

    # When it is probed
    answer = effect.probe(context, trace.recorded)

    # Then it cannot tell (a person resolves it as failed; it is never submitted again) with the state
    assert answer.answer is Answer.CANNOT_TELL
    assert outcome in answer.evidence
    assert answer.values["apple_state"] == outcome


def test_probe_cannot_tell_when_the_recorded_id_names_another_submission(apple, tmp_path, stapler):
    service, _ = apple
    # Given a recorded id whose submission carries another operation's name
    file = _file(tmp_path)
    sha = hashlib.sha256(DMG).hexdigest()
    other_name = submission_name(file, sha, "job_zzzzzzzzzzzzzzzzzzzz:notarize")
    other = service.notary.submit(NewSubmissionRequest(sha256=sha, submissionName=other_name))
    recorded = {
        "sha256": sha,
        "submission_name": submission_name(file, sha, OPERATION),
        "submission_id": other.id,
        "uploaded": "true",
    }

    # When it is probed, then it cannot tell: what was found is not provably this operation's
    answer = _effect_for(stapler, service).probe(_context(apple, file)[0], recorded)
    assert answer.answer is Answer.CANNOT_TELL
    assert other.id in answer.evidence


def test_probe_cannot_tell_when_apple_cannot_be_reached_or_refuses_the_key(apple, tmp_path, stapler):
    service, client = apple
    file = _file(tmp_path)
    effect = _effect_for(stapler, service)
    # Given nothing listening where the notary service should be, when probed: cannot tell
    unreachable, _ = _context(apple, file, notary="http://127.0.0.1:9/notary/v2")
    assert effect.probe(unreachable, {}).answer is Answer.CANNOT_TELL

    # Given the key revoked at Apple (401), when probed: cannot tell, saying so
    service.keys.revoke(client.key.issuer, client.key.key_id)
    answer = effect.probe(_context(apple, file)[0], {})
    assert answer.answer is Answer.CANNOT_TELL
    assert "401" in answer.evidence


# -- resume never submits ------------------------------------------------------------------------


def test_resume_with_nothing_to_wait_for_submits_nothing(apple, tmp_path, stapler):
    service, _ = apple
    # Given no submission at Apple
    file = _file(tmp_path)
    context, _ = _context(apple, file)

    # When resume is called, then it fails for a person to decide, and Apple has no submission
    with pytest.raises(EffectFailed) as failed:
        _effect_for(stapler, service).resume(context, {})
    assert failed.value.error_class is ErrorClass.MANUAL_REVIEW
    assert service.notary.submissions == {}


# -- bad input: refused before anything is submitted ---------------------------------------------


def _refused(apple, tmp_path, stapler, secrets=None, name="Relevo-1.4.dmg", spec_file=None):
    service, _ = apple
    file = _file(tmp_path, name)
    context, trace = _context(apple, file, secrets=secrets)
    with pytest.raises(EffectFailed) as failed:
        _effect_for(stapler, service, spec_file or f"dist/{name}").perform(context)
    assert failed.value.error_class is ErrorClass.EFFECT_REFUSED
    assert service.notary.submissions == {}
    return failed.value.message, trace


def test_a_missing_key_is_refused_naming_it(apple, tmp_path, stapler):
    # Given no such secret: the agent's read refuses it with Secrets Manager's error
    message, trace = _refused(apple, tmp_path, stapler, secrets={})
    assert KEY in message and "ResourceNotFoundException" in message
    assert trace.records == []


@pytest.mark.parametrize(
    ("broken", "named"),
    [
        ({"key_id": "2X9R4HXF34", "private_key": "MIGHAgEAMBMGByqGSM49AgEG"}, "issuer_id"),
        ({"key_id": "2X9R4HXF34", "issuer_id": "i", "private_key": "MIGHAgEAnot-a-PEM"}, "private_key"),
    ],
)
def test_a_malformed_key_is_refused_naming_what_is_wrong(apple, tmp_path, stapler, broken, named):
    message, trace = _refused(apple, tmp_path, stapler, secrets={KEY: broken})
    assert "malformed" in message and named in message
    assert broken["private_key"] not in message
    assert trace.records == []


def test_a_key_apple_refuses_is_refused_with_its_401(apple, tmp_path, stapler):
    # Given a well-formed key Apple does not know
    stranger = key_secret(new_key(key_id="ZZZZZZZZZZ"))
    message, _ = _refused(apple, tmp_path, stapler, secrets={KEY: stranger})
    assert "401" in message


def test_a_file_apple_does_not_notarize_is_refused(apple, tmp_path, stapler):
    message, _ = _refused(apple, tmp_path, stapler, name="Relevo.app.tar")
    assert ".zip, .dmg or .pkg" in message


def test_a_stapled_notarization_on_an_agent_without_a_stapler_is_refused_before_submitting(
    apple, tmp_path, monkeypatch
):
    # Given an agent with no stapler (not macOS, none configured)
    monkeypatch.setattr("relevo_agent.effects.stapling.platform.system", lambda: "Linux")
    message, _ = _refused(apple, tmp_path, None)
    assert "no stapler" in message
