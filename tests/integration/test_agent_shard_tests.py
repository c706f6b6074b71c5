"""A shard's part of its stage's test plan on the agent (relevo_agent.shard_tests): the listing
stored at the key its sha256 gives, the plan asked for and verified, `$RELEVO_SHARD_TESTS` one
listed id a line with its count, a refused listing failing the shard for good, and the check of
what it ran. Listings and plans go to the session emulator's S3; the plans route (Relevo's own)
is played by FakeRoutes, answering as the stack does."""

from __future__ import annotations

import hashlib
import secrets
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from relevo_agent.claim_routes import RouteError, RouteUnreachable
from relevo_agent.ending import Ending
from relevo_agent.shard_tests import ShardTestsFailed, checked, listing_of, shard_tests
from relevo_core.aws import client
from relevo_core.models import test_results
from relevo_core.models.agent_session import PlanGranted
from relevo_core.models.errors import ErrorClass
from relevo_core.models.plan import StagePlan
from relevo_core.models.status import StageStatus
from relevo_core.shard_plans.split import split_tests

JOB = "job_" + "x" * 26
PLAN = StagePlan(
    name="test",
    command="pytest -q $(cat $RELEVO_SHARD_TESTS)",
    parallel=2,
    tests={"junit": ["results/*.xml"], "plan": {"command": "pytest --collect-only -q", "format": "pytest"}},
)
LISTING = (
    b"tests/test_a.py::test_one\ntests/test_a.py::TestB::test_two[a/b]\n"
    b"tests/test_c.py::test_three\n\n3 tests\n"
)


BUCKET = "shard-tests-" + secrets.token_hex(4)


@pytest.fixture()
def s3(local_stack) -> Any:
    """The emulator's S3, with the artifact bucket the envelope names."""
    s3 = client("s3")
    if BUCKET not in {bucket["Name"] for bucket in s3.list_buckets()["Buckets"]}:
        s3.create_bucket(Bucket=BUCKET)
    return s3


def _stored(s3: Any, key: str) -> bytes:
    return s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()


class FakeRoutes:
    """The plans route as the stack answers it: the plan made from the stored listing."""

    def __init__(self, s3: Any, refuse: str | None = None, details: dict[str, Any] | None = None) -> None:
        self.s3, self.refuse, self.details, self.asked = s3, refuse, details, []

    def plan(self, request):
        self.asked.append(request)
        if self.refuse:
            raise RouteError(409, self.refuse, "shard 1 listed other tests", self.details)
        from relevo_core.shard_plans.listing import read_listing

        listing = _stored(self.s3, f"p/{JOB}/.relevo-tests/test.listing.{request.listing_sha256}.txt")
        plan = split_tests("test", read_listing(listing, "pytest"), 2, request.listing_sha256, [])
        body = plan.model_dump_json().encode()
        self.s3.put_object(Bucket=BUCKET, Key=f"p/{JOB}/.relevo-tests/test.plan.shard-0.json", Body=body)
        return PlanGranted(
            plan_key=f"p/{JOB}/.relevo-tests/test.plan.shard-0.json",
            plan_sha256=hashlib.sha256(body).hexdigest(),
            listing_sha256=request.listing_sha256,
            by="count",
            tests=2,
            expected_sec=0,
            made_now=True,
        )


def _envelope():
    class Envelope:
        artifact_uri = f"s3://{BUCKET}/p/{JOB}/"

    return Envelope()


REQUEST = {
    "job_id": JOB,
    "stage_index": 0,
    "shard": 0,
    "attempt": 1,
    "agent_id": "mac-1",
    "claim_secret": "a" * 64,
}


def test_a_shard_is_given_its_listed_ids_in_a_file_and_their_count(tmp_path: Path, s3: Any):
    # Given a stage of 2 shards with a pytest plan, and the route that makes it
    routes = FakeRoutes(s3)
    # When shard 0 asks with its listing
    tests = shard_tests(routes, REQUEST, PLAN, _envelope(), LISTING, tmp_path, s3)
    # Then the listing's node ids were stored at the key their sha256 gives (pytest's count line
    # left out), and asked for with that sha256
    ids = LISTING.split(b"\n\n")[0] + b"\n"
    sha = hashlib.sha256(ids).hexdigest()
    assert _stored(s3, f"p/{JOB}/.relevo-tests/test.listing.{sha}.txt") == ids
    assert routes.asked[0].listing_sha256 == sha and routes.asked[0].shard == 0
    # And its tests are in $RELEVO_SHARD_TESTS, one listed id a line, as pytest takes them back
    env = tests.environment()
    assert Path(env["RELEVO_SHARD_TESTS"]).read_text().splitlines() == [
        "tests/test_a.py::test_one",
        "tests/test_c.py::test_three",
    ]
    assert env["RELEVO_SHARD_TEST_COUNT"] == "2"
    # And the check holds it to exactly those
    ran = [
        test_results.TestResult(id="tests.test_a::test_one", name="test_one", status="passed"),
    ]
    check = tests.check(ran)
    assert check.error_class is ErrorClass.TESTS_MISSING and check.missing == ["tests.test_c::test_three"]


def test_two_shards_whose_pytest_listings_differ_only_in_pytest_s_count_line_ask_for_one_plan(
    tmp_path: Path, s3: Any
):
    # Given two shards of a stage on two Macs, whose `pytest --collect-only -q` listed the same
    # tests, each ending with the time its collection took
    routes = FakeRoutes(s3)
    ids = b"tests/test_a.py::test_one\ntests/test_c.py::test_three\n"
    first, second = ids + b"\n2 tests collected in 0.43s\n", ids + b"\n2 tests collected in 0.51s\n"

    # When each asks for the plan
    shard_tests(routes, REQUEST, PLAN, _envelope(), first, tmp_path / "0", s3)
    shard_tests(routes, {**REQUEST, "shard": 1}, PLAN, _envelope(), second, tmp_path / "1", s3)

    # Then both asked with the sha256 of the same listing, the tests it names
    assert [request.listing_sha256 for request in routes.asked] == [hashlib.sha256(ids).hexdigest()] * 2


def test_a_listing_other_than_the_plan_s_fails_the_shard_for_good(tmp_path: Path, s3: Any):
    with pytest.raises(ShardTestsFailed) as failed:
        shard_tests(FakeRoutes(s3, "TEST_LISTING_DIFFERS"), REQUEST, PLAN, _envelope(), LISTING, tmp_path, s3)
    assert failed.value.error_class is ErrorClass.TEST_PLAN and not failed.value.error_class.retryable
    assert "listed other tests" in failed.value.message


def test_a_plan_read_back_that_is_not_the_one_recorded_is_refused(tmp_path: Path, s3: Any):
    routes = FakeRoutes(s3)
    real = routes.plan

    def tampered(request):
        granted = real(request)
        s3.put_object(Bucket=BUCKET, Key=granted.plan_key, Body=b'{"stage": "test"}')
        return granted

    routes.plan = tampered
    with pytest.raises(ShardTestsFailed) as failed:
        shard_tests(routes, REQUEST, PLAN, _envelope(), LISTING, tmp_path, s3)
    assert failed.value.error_class is ErrorClass.CHECKSUM


def test_a_list_file_the_stage_names_is_read_from_the_workspace(tmp_path: Path):
    plan = StagePlan.model_validate(
        PLAN.model_dump()
        | {"tests": {"junit": ["results/*.xml"], "plan": {"file": "build/tests.txt", "format": "lines"}}}
    )
    (tmp_path / "build").mkdir()
    (tmp_path / "build" / "tests.txt").write_bytes(b"a::b\n")
    assert listing_of(plan, tmp_path, lambda command: b"") == b"a::b\n"
    with pytest.raises(ShardTestsFailed) as failed:
        listing_of(plan, tmp_path / "elsewhere", lambda command: b"")
    assert failed.value.error_class is ErrorClass.TEST_PLAN


def test_a_shard_failed_for_tests_missing_keeps_what_its_reports_said(tmp_path: Path, s3: Any):
    # Given a shard planned two tests, whose truncated report named one, said in a warning
    tests = shard_tests(FakeRoutes(s3), REQUEST, PLAN, _envelope(), LISTING, tmp_path, s3)
    summary = {"total": 1, "passed": 1, "warnings": ["results/junit.xml:4: malformed or truncated XML"]}
    ending = Ending.succeeded({"exit_code": 0}, 0, status=StageStatus.WARNING)
    ending = replace(ending, tests=summary)
    ran = [test_results.TestResult(id="tests.test_a::test_one", name="test_one", status="passed")]

    # When it is checked against its part of the plan
    checked_ending = checked(
        tests, ran, ending, type("Log", (), {"line": lambda self, text: None})(), "mac-1"
    )

    # Then it fails as TestsMissing, and its reports' summary (the counts, the warning) stays on it
    assert checked_ending.error is ErrorClass.TESTS_MISSING
    assert checked_ending.tests == summary


def _lines_plan(tmp_path: Path) -> StagePlan:
    """A plan whose listing is a file of the workspace (no listing command to run)."""
    (tmp_path / "tests.txt").write_bytes(b"tests.test_a::test_one\n")
    return StagePlan.model_validate(
        PLAN.model_dump()
        | {"tests": {"junit": ["results/*.xml"], "plan": {"file": "tests.txt", "format": "lines"}}}
    )


def _for_shard(
    tmp_path: Path, routes: Any, attempt: int = 1, reason: str | None = None
) -> tuple[Ending, list[str]]:
    """relevo_agent.shard_tests.for_shard for shard 1 of the stage on mac-2 with these plans
    `routes`, the attempt stopped for `reason` if given: the Ended it raised, and the lines it logged."""
    from types import SimpleNamespace

    from relevo_agent.ending import Ended
    from relevo_agent.shard_tests import for_shard

    lines: list[str] = []
    command = SimpleNamespace(routes=routes, config=SimpleNamespace(agent_id="mac-2"), under_lease=None)
    run = SimpleNamespace(
        ref=SimpleNamespace(job_id=JOB, stage_index=0, shard=1, attempt=attempt),
        claim_secret="a" * 64,
        reason=reason,
        cancel=threading.Event(),
    )
    if reason is not None:
        run.cancel.set()  # a wait returns at once: the attempt was stopped
    with pytest.raises(Ended) as ended:
        for_shard(
            command,
            run,
            _lines_plan(tmp_path),
            tmp_path,
            _envelope(),
            {},
            SimpleNamespace(line=lines.append),
            lambda _: None,
        )
    return ended.value.ending, lines


@pytest.mark.parametrize(
    ("details", "stopped"),
    [({"status": "canceled"}, "canceled"), ({"status": "running"}, "lease_lost"), (None, "lease_lost")],
)
def test_a_shard_whose_attempt_ended_before_its_plan_stops_with_nothing_reported(
    tmp_path: Path, s3: Any, details: dict[str, Any] | None, stopped: str
):
    """A shard's retry claimed just before its job was canceled (a sibling failed for good): the
    plans route refuses it 409 ATTEMPT_ENDED. The attempt stops as on a refused heartbeat, with
    nothing reported, `canceled` when the record says so (else its lease is lost); the refusal
    raised on crashed the agent's handling of the stage (CI's peer suite: "crashed in the agent;
    handing the message back" and a traceback in the agent's log)."""
    from relevo_agent.journal import OperationOutcome

    ending, lines = _for_shard(tmp_path, FakeRoutes(s3, refuse="ATTEMPT_ENDED", details=details), attempt=2)
    assert ending.outcome is OperationOutcome.ABANDONED
    assert ending.stopped == stopped and ending.error is None
    assert any("the test plan was refused" in line for line in lines), lines


class UnreachableRoutes:
    """A plans route that never answers (a partition between the Mac and API Gateway)."""

    def __init__(self) -> None:
        self.calls = 0

    def plan(self, request):
        self.calls += 1
        raise RouteUnreachable("POST /regions/eu-west/plans: timed out after 10.00s")


def test_a_shard_whose_plans_route_never_answers_fails_as_a_retryable_network_failure(
    tmp_path: Path, s3: Any, monkeypatch: pytest.MonkeyPatch
):
    """The plans route unreachable (no answer, API Gateway's 5xx) is asked again for
    PLAN_ROUTE_BUDGET_SEC, then the attempt ends as a transient failure, reported like any
    ending. Before, RouteUnreachable went up through the stage: "crashed in the agent; handing
    the message back", no ending reported, and the stage waited for its lease to lapse."""
    from relevo_agent import shard_tests as module
    from relevo_agent.journal import OperationOutcome

    # A budget already spent at the first failure: the test waits for nothing.
    monkeypatch.setattr(module, "PLAN_ROUTE_BUDGET_SEC", 0.0)
    routes = UnreachableRoutes()
    ending, lines = _for_shard(tmp_path, routes)
    assert ending.outcome is OperationOutcome.FAILED and ending.error is ErrorClass.NETWORK_TIMEOUT
    assert ending.error.retryable and routes.calls == 1
    assert any("the plans route did not answer" in line for line in lines), lines


def test_a_shard_stopped_while_it_waits_for_its_plan_ends_as_its_stop_says(tmp_path: Path, s3: Any):
    """A fence or a cancel during the wait between two calls: the attempt stops at once, as a
    stop of its command would (Ending.stopped_by), and asks no more."""
    routes = UnreachableRoutes()
    ending, _ = _for_shard(tmp_path, routes, reason="canceled")
    assert ending == Ending.stopped_by("canceled", -1)
    assert routes.calls == 1


class FlakyRoutes(FakeRoutes):
    """The plans route, giving no answer to its first call."""

    def plan(self, request):
        if not self.asked:
            self.asked.append(request)
            raise RouteUnreachable("POST /regions/eu-west/plans: HTTP 502")
        return super().plan(request)


def test_a_caller_that_names_no_stop_waits_between_calls_and_gets_the_plan(
    tmp_path: Path, s3: Any, monkeypatch: pytest.MonkeyPatch
):
    """shard_tests without `stopped` waits between calls as a plain wait (it never hammers the
    route, and is never stopped): here a wait of 0 s, so the test waits for nothing."""
    from relevo_agent import shard_tests as module

    monkeypatch.setattr(module, "PLAN_RETRY_SEC", 0.0)
    routes = FlakyRoutes(s3)
    tests = shard_tests(routes, REQUEST, PLAN, _envelope(), LISTING, tmp_path / "lists", s3=s3)
    assert len(routes.asked) == 2 and tests.plan.tests
