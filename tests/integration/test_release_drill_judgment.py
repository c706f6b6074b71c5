"""How `relevo-tools drill release` judges a trial (relevo_tools.drill.release.release_problems): by
what the local Apple service holds, not by what the agent says. A second build upload of the job's
version and build number, a second submission bearing its notarize operation, or a build number
another job of the drill was given each fail the trial."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from relevo_local.apple.notary import NewSubmissionRequest
from relevo_local.apple.provision import LocalApple, start_local_apple
from relevo_tools.drill.release import VERSION, release_problems

JOB = "j-0123456789abcdef"


@pytest.fixture
def apple() -> Iterator[LocalApple]:
    started = start_local_apple()
    yield started
    started.stop()


def _job(build_number: int | None = 7, status: str = "succeeded") -> dict:
    stages = [{"name": name, "status": status} for name in ("build", "upload", "notarize")]
    return {"job_id": JOB, "status": status, "build_number": build_number, "stages": stages}


def _upload(apple: LocalApple, build: str) -> None:
    apple.service.connect.create_upload(apple.app_id, VERSION, build, "IOS")


def _submit(apple: LocalApple, job_id: str = JOB) -> None:
    name = f"App.0123456789abcdef.{job_id}.notarize.zip"
    apple.service.notary.submit(NewSubmissionRequest(sha256="a" * 64, submissionName=name))


def test_one_upload_and_one_submission_of_the_job_hold(apple):
    # Given Apple holds one upload of 1.0 (7) and one submission of the job's notarize stage
    _upload(apple, "7")
    _submit(apple)
    _submit(apple, "j-another-job")  # another job's: not this one's

    # When the trial is judged, then it holds, each effect counted once
    effects, problems = release_problems(apple, _job(), {})
    assert problems == []
    assert effects == {f"{JOB}:upload": 1, f"{JOB}:notarize": 1}


def test_a_second_upload_of_the_build_is_a_duplicate(apple):
    # Given Apple accepted a second upload of 1.0 (7) (armed to, as ITMS-90189 in processing)
    _upload(apple, "7")
    apple.service.faults.redundant_binary_in_processing()
    _upload(apple, "7")
    _submit(apple)

    # When the trial is judged, then it does not hold: a duplicate upload
    effects, problems = release_problems(apple, _job(), {})
    assert effects[f"{JOB}:upload"] == 2
    assert problems == [
        f"duplicate effect: {JOB}:upload: 2 build uploads of {VERSION} (7) at the local Apple service"
    ]


def test_a_second_submission_of_the_job_is_a_duplicate(apple):
    # Given two submissions bearing the job's notarize operation
    _upload(apple, "7")
    _submit(apple)
    _submit(apple)

    # When the trial is judged, then it does not hold: a duplicate submission
    _, problems = release_problems(apple, _job(), {})
    assert problems == [
        f"duplicate effect: {JOB}:notarize: 2 notarizations submitted at the local Apple service"
    ]


def test_a_build_number_another_job_was_given_or_none_does_not_hold(apple):
    # Given the job's effects there once
    _upload(apple, "7")
    _submit(apple)

    # When its build number was given to an earlier job of the drill, or it has none
    _, twice = release_problems(apple, _job(), {7: "j-earlier"})
    _, none = release_problems(apple, _job(build_number=None), {})

    # Then neither holds
    assert twice == [f"build number given twice: 7 to j-earlier and {JOB}"]
    assert f"no build number: {JOB} was given none" in none


def test_a_stage_succeeded_without_its_effect_at_apple_is_lost_and_a_failed_one_not_held(apple):
    # Given nothing at Apple for a job whose stages say they succeeded
    _, lost = release_problems(apple, _job(), {})
    # And a job whose stages failed
    _, failed = release_problems(apple, _job(status="failed"), {})

    # Then the first lost both effects, the second held neither stage
    assert [p.split(":")[0] for p in lost] == ["lost effect", "lost effect"]
    assert any(p.startswith(f"not held: {JOB}:upload failed") for p in failed)
    assert any(p.startswith(f"wrongly failed job: {JOB} failed") for p in failed)
