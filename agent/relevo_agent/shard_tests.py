"""A shard's part of its stage's test plan (docs/test-results.md, "The plan"), on the agent.

Before the command: the stage's listing made here (its `tests.plan.file`, or its `command` run in
the workspace as the build user with the stage's environment, its standard output the listing),
stored under the job's prefix with the job's session at the key its sha256 gives, and the plan
asked for through the region's plans route for the shard this claim holds (made once per stage of
the job: relevo_core.fleet.test_plans). The shard's tests are written one listed id a line to a
file, `$RELEVO_SHARD_TESTS` (their count in `$RELEVO_SHARD_TEST_COUNT`), for the command to run.

After the command: the tests the shard's reports say it ran, checked against its part of the plan
(relevo_core.shard_plans.check): a failure is the attempt's, for good (TestsMissing, TestsUnplanned).
A listing other than the plan's, or one that cannot be made or read, fails it too (TestPlan).
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from relevo_core.aws import call_budget, client
from relevo_core.models.agent_session import PlanRequest
from relevo_core.models.errors import ErrorClass
from relevo_core.models.job_objects import JobPrefix, test_listing_key
from relevo_core.models.test_results import ShardPlan, TestPlan
from relevo_core.shard_plans.check import PlanCheck, check_shard
from relevo_core.shard_plans.listing import listed_part

if TYPE_CHECKING:
    from relevo_agent.attempt import StageRun
    from relevo_agent.claim_routes import ClaimRoutes
    from relevo_agent.ending import Ending
    from relevo_core.models.agent_session import PlanGranted
    from relevo_core.models.envelope import JobEnvelope
    from relevo_core.models.plan import StagePlan
    from relevo_core.models.test_results import TestResult

log = logging.getLogger(__name__)

# How long a shard keeps asking for its plan while the plans route does not answer (no answer, or
# a 5xx: API Gateway's 502-504, a function's error), each call bounded to PLAN_CALL_SEC, the
# waits between them doubling from PLAN_RETRY_SEC to PLAN_RETRY_MAX_SEC. The plans route answers
# the same plan to every call of a stage's shards (relevo_core.fleet.test_plans), so a call whose
# answer was lost is safe to send again. Past the budget the attempt fails as a transient network
# failure (retryable), reported through the outbox like any ending.
PLAN_ROUTE_BUDGET_SEC = 60.0
PLAN_CALL_SEC = 10.0
PLAN_RETRY_SEC = 0.5
PLAN_RETRY_MAX_SEC = 8.0


class PlanWaitStopped(Exception):
    """The attempt was stopped (fenced, canceled, shut down) while its plan was being asked for."""


def ask_for_plan(
    routes: ClaimRoutes,
    request: PlanRequest,
    stopped: Callable[[float], bool],
    budget_sec: float | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> PlanGranted:
    """The plans route's answer, asked again while it gives none (RouteUnreachable, a 5xx) for up
    to `budget_sec` (PLAN_ROUTE_BUDGET_SEC) by `clock`; `stopped(seconds)` waits between calls and
    says whether the attempt was stopped meanwhile (PlanWaitStopped). A refusal (4xx) is raised as
    it came; no answer within the budget is ShardTestsFailed NETWORK_TIMEOUT, retryable."""
    from relevo_agent.claim_routes import RouteError, RouteUnreachable

    budget_sec = PLAN_ROUTE_BUDGET_SEC if budget_sec is None else budget_sec
    give_up = clock() + budget_sec
    delay = PLAN_RETRY_SEC
    calls = 0
    while True:
        calls += 1
        try:
            with call_budget(max(0.5, min(PLAN_CALL_SEC, give_up - clock()))):
                return routes.plan(request)
        except RouteUnreachable as exc:
            failure = str(exc)
        except RouteError as refused:
            if refused.status < 500:
                raise
            failure = f"HTTP {refused.status} {refused.code}: {refused.message}"
        if clock() + delay > give_up:
            raise ShardTestsFailed(
                ErrorClass.NETWORK_TIMEOUT,
                f"the plans route did not answer in {budget_sec:g}s ({calls} calls; the last: {failure})",
                {"why": failure, "calls": calls, "budget_sec": budget_sec},
            )
        log.warning(
            "%s/%d shard %s: the plans route did not answer (%s); asking again in %.1fs",
            request.job_id,
            request.stage_index,
            request.shard,
            failure,
            delay,
        )
        if stopped(delay):
            raise PlanWaitStopped
        delay = min(2 * delay, PLAN_RETRY_MAX_SEC)


class ShardTestsFailed(Exception):
    """The shard cannot run its part of the plan: its class (retryable only for a plans route
    that never answered) and why."""

    def __init__(self, error_class: ErrorClass, message: str, cause: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.error_class = error_class
        self.message = message
        self.cause = cause or {"why": message}


@dataclass(frozen=True)
class ShardTests:
    """This shard's part of the plan, and the file that hands it to the command."""

    plan: ShardPlan
    allow_empty: bool
    path: Path

    def environment(self) -> dict[str, str]:
        return {"RELEVO_SHARD_TESTS": str(self.path), "RELEVO_SHARD_TEST_COUNT": str(len(self.plan.tests))}

    def check(self, ran: list[TestResult]) -> PlanCheck:
        return check_shard(self.plan, ran, self.allow_empty)


def listing_of(plan: StagePlan, workspace: Path, run_listing: Callable[[str], bytes]) -> bytes:
    """The stage's listing: its file in the workspace, or what its command printed
    (`run_listing`, which runs it as the stage's command runs, and raises ShardTestsFailed when it
    fails)."""
    assert plan.tests is not None and plan.tests.plan is not None
    settings = plan.tests.plan
    if settings.command is not None:
        return run_listing(settings.command)
    assert settings.file is not None
    path = workspace / settings.file
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ShardTestsFailed(
            ErrorClass.TEST_PLAN, f"the test list {settings.file} could not be read: {exc.strerror}"
        ) from None


def shard_tests(
    routes: ClaimRoutes,
    request: dict[str, Any],
    plan: StagePlan,
    envelope: JobEnvelope,
    listing: bytes,
    directory: Path,
    s3: Any = None,
    stopped: Callable[[float], bool] | None = None,
) -> ShardTests:
    """Store the listing (the job's session is in scope: relevo_core.aws.job_scope), ask for the
    plan (ask_for_plan, `stopped` waiting between calls: by default a plain wait, never stopped),
    read it, and write this shard's list.
    `request`: the attempt's fields (job_id, stage_index, shard, attempt, agent_id, claim_secret)."""
    from relevo_agent.claim_routes import RouteError

    assert plan.tests is not None and plan.tests.plan is not None
    home = JobPrefix.of(envelope.artifact_uri)
    # The tests it names, not what the runner printed around them: the shards' listings compare.
    listing = listed_part(listing, plan.tests.plan.format)
    sha = hashlib.sha256(listing).hexdigest()
    s3 = s3 or client("s3")
    s3.put_object(Bucket=home.bucket, Key=test_listing_key(home, plan.name, sha), Body=listing)
    try:
        granted = ask_for_plan(
            routes, PlanRequest(**request, listing_sha256=sha), stopped or threading.Event().wait
        )
    except RouteError as refused:
        if refused.code in ("TEST_LISTING_DIFFERS", "TEST_LISTING_INVALID", "TEST_PLAN_NOT_DECLARED"):
            raise ShardTestsFailed(
                ErrorClass.TEST_PLAN,
                f"no test plan for this shard: {refused.message}",
                {"why": refused.message, "code": refused.code, "listing_sha256": sha},
            ) from None
        raise
    body = s3.get_object(Bucket=home.bucket, Key=granted.plan_key)["Body"].read()
    if hashlib.sha256(body).hexdigest() != granted.plan_sha256:
        raise ShardTestsFailed(
            ErrorClass.CHECKSUM, f"the test plan at {granted.plan_key} is not the one recorded"
        )
    whole = TestPlan.model_validate_json(body)
    mine = next(part for part in whole.shards if part.shard == request["shard"])
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{request['job_id']}.{plan.name}.shard-{request['shard']}.{request['attempt']}.tests"
    path.write_text("".join(f"{test.listed}\n" for test in mine.tests))
    log.info(
        "%s %s shard %s: %d tests planned (%s, %.1fs expected)",
        request["job_id"],
        plan.name,
        request["shard"],
        len(mine.tests),
        whole.by,
        mine.expected_sec,
    )
    return ShardTests(mine, whole.allow_empty, path)


def for_shard(
    command: Any,  # the StageCommand: its routes, its agent id, its under_lease
    run: StageRun,
    plan: StagePlan,
    workspace: Path,
    envelope: JobEnvelope,
    env: dict[str, str],
    shipper: Any,
    on_output: Callable[[bytes], None],
) -> ShardTests | None:
    """The attempt's part of the plan, its listing's command run under its lease as the stage's
    command runs (as the build user, with the stage's environment `env`), its standard output
    into a file of the workspace; a listing that cannot be made or is not the plan's ends the attempt
    for good, a plans route that never answered as a transient failure, a stop while waiting for it
    as the stop says (Ended). None for a stage without a plan, or an agent without the claim routes."""
    import shlex

    routes, agent_id = command.routes, command.config.agent_id
    if plan.tests is None or plan.tests.plan is None or run.ref.shard is None or routes is None:
        return None
    from relevo_agent.claim_routes import RouteError
    from relevo_agent.ending import Ended, Ending

    ref = run.ref
    listing_file = workspace / ".relevo-tests" / f"{ref.job_id}.{plan.name}.shard-{ref.shard}.listing"

    def run_listing(listing: str) -> bytes:
        shipper.line(f"[relevo] listing the stage's tests: {listing}")
        into = shlex.quote(str(listing_file))
        wrapped = f"mkdir -p {shlex.quote(str(listing_file.parent))} && ( {listing} ) > {into}"
        result = command.under_lease(run, plan, wrapped, workspace, env, on_output)
        if run.reason is not None:
            raise Ended(Ending.stopped_by(run.reason, result.exit_code))
        if result.exit_code != 0:
            raise ShardTestsFailed(
                ErrorClass.TEST_PLAN, f"the stage's test listing command exited {result.exit_code}"
            )
        try:
            return listing_file.read_bytes()
        finally:
            listing_file.unlink(missing_ok=True)

    request = {
        "job_id": ref.job_id,
        "stage_index": ref.stage_index,
        "shard": ref.shard,
        "attempt": ref.attempt,
        "agent_id": agent_id,
        "claim_secret": run.claim_secret,
    }
    directory = workspace / ".relevo-artifacts" / ref.job_id / ".relevo-tests"
    try:
        tests = shard_tests(
            routes,
            request,
            plan,
            envelope,
            listing_of(plan, workspace, run_listing),
            directory,
            stopped=run.cancel.wait,
        )
    except PlanWaitStopped:
        raise Ended(Ending.stopped_by(run.reason, -1)) from None
    except ShardTestsFailed as failed:
        shipper.line(f"[relevo] {failed.error_class.value}: {failed.message}")
        raise Ended(
            Ending.failed(failed.error_class, {**failed.cause, "agent_id": agent_id, "attempt": ref.attempt})
        ) from None
    except RouteError as refused:
        if not refused.no_longer_held:
            raise
        # The attempt no longer holds the stage (its job was canceled or ended, a sibling failed,
        # or another attempt took over): as on a heartbeat so refused (relevo_agent.keeper), it
        # stops here with nothing reported. Raised on, it crashed the agent's handling of the stage.
        shipper.line(f"[relevo] the test plan was refused ({refused.message}); stopping the shard")
        raise Ended(Ending.abandoned(stopped="canceled" if refused.canceled else "lease_lost")) from None
    shipper.line(f"[relevo] this shard runs {len(tests.plan.tests)} planned tests ($RELEVO_SHARD_TESTS)")
    return tests


def checked(
    planned: ShardTests, ran: Sequence[TestResult] | None, ending: Ending, shipper: Any, agent_id: str
) -> Ending:
    """The ending, or a failure for good when the shard did not run exactly the tests it was
    given: `ran`, what its reports say it ran (relevo_agent.test_reports; None when none were
    read, as if it ran nothing)."""
    from relevo_agent.ending import Ending

    check = planned.check(list(ran or ()))
    shipper.line(f"[relevo] {check.message()}")
    if check.error_class is None:
        return ending
    failed = Ending.failed(check.error_class, {**check.cause(), "agent_id": agent_id}, ending.receipt)
    # What its reports said stays on the shard's record (its counts, a truncated report's warning).
    return replace(failed, tests=ending.tests)
