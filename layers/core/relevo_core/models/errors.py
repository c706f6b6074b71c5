"""Stable error codes (API refusals) and error classes (stage failures).

Both are part of the public contract: clients, dashboards and the state machine match on these
strings, so they never change once published.
"""

from __future__ import annotations

from enum import Enum
from http import HTTPStatus


class ErrorCode(str, Enum):
    """Codes carried by every refusal the API or a reader gives."""

    MALFORMED_JSON = "MALFORMED_JSON"
    VALIDATION_FAILED = "VALIDATION_FAILED"
    SIGNATURE_INVALID = "SIGNATURE_INVALID"
    ENVELOPE_VERSION_UNSUPPORTED = "ENVELOPE_VERSION_UNSUPPORTED"
    PROJECT_NOT_FOUND = "PROJECT_NOT_FOUND"
    JOB_NOT_FOUND = "JOB_NOT_FOUND"
    PAYLOAD_TOO_LARGE = "PAYLOAD_TOO_LARGE"
    QUEUE_FULL = "QUEUE_FULL"
    FORBIDDEN = "FORBIDDEN"
    UNAUTHENTICATED = "UNAUTHENTICATED"
    REGION_UNKNOWN = "REGION_UNKNOWN"
    SECRET_UNAVAILABLE = "SECRET_UNAVAILABLE"
    JOB_NOT_HELD = "JOB_NOT_HELD"
    JOB_ALREADY_ENDED = "JOB_ALREADY_ENDED"
    DLQ_ENTRY_NOT_FOUND = "DLQ_ENTRY_NOT_FOUND"
    JOB_NOT_WAITING = "JOB_NOT_WAITING"
    STAGE_UNKNOWN = "STAGE_UNKNOWN"
    # Given by API Gateway itself (template GatewayResponses) or the resolvers' fallback.
    ROUTE_NOT_FOUND = "ROUTE_NOT_FOUND"
    THROTTLED = "THROTTLED"
    REQUEST_REFUSED = "REQUEST_REFUSED"
    STAGE_NOT_IN_REVIEW = "STAGE_NOT_IN_REVIEW"
    KEY_FROZEN = "KEY_FROZEN"
    KEY_NOT_FROZEN = "KEY_NOT_FROZEN"
    # Promote and priority apply to queued jobs only; delete to ended jobs only.
    JOB_NOT_QUEUED = "JOB_NOT_QUEUED"
    JOB_NOT_ENDED = "JOB_NOT_ENDED"
    JOB_NOT_STARTED = "JOB_NOT_STARTED"
    PRIORITY_OUT_OF_RANGE = "PRIORITY_OUT_OF_RANGE"
    QUERY_INVALID = "QUERY_INVALID"
    ARTIFACT_NOT_FOUND = "ARTIFACT_NOT_FOUND"
    ARTIFACT_AMBIGUOUS = "ARTIFACT_AMBIGUOUS"
    # The artifact's object was deleted by the project's artifact.max_total_bytes (its record stays).
    ARTIFACT_REMOVED = "ARTIFACT_REMOVED"
    # A plan over a limit of what a job's execution can carry (relevo_core.plan_limits).
    PLAN_TOO_LARGE = "PLAN_TOO_LARGE"
    GROUP_NOT_FOUND = "GROUP_NOT_FOUND"
    # Pause, drain, resume: an agent no region of the fleet has a presence record of.
    AGENT_NOT_FOUND = "AGENT_NOT_FOUND"
    # A rerun from a stage whose skipped stages' handoffs are no longer stored (expired, or removed
    # by artifact.max_total_bytes): refused when asked for, never failing halfway.
    HANDOFF_EXPIRED = "HANDOFF_EXPIRED"
    # The claim routes (POST /regions/{region}/claims, /sessions): the attempt is another's, or
    # over, or not held by this claim any more; a next stage left to the Mac of the one before.
    CLAIM_REFUSED = "CLAIM_REFUSED"
    # No dispatch of this attempt to this region under this key: stale, or never this region's.
    DISPATCH_NOT_FOUND = "DISPATCH_NOT_FOUND"
    ATTEMPT_NOT_HELD = "ATTEMPT_NOT_HELD"
    # The attempt is this claim's but holds nothing any more: it ended, its lease ran out (fenced),
    # or its job went on past it (waits at a later stage's gate): no session, heartbeat or answer.
    ATTEMPT_ENDED = "ATTEMPT_ENDED"
    # The outcome and heartbeat routes: the state machine has not handed this attempt a run token
    # (it never took the claim), so there is no task to answer: its timeouts decide.
    RUN_NOT_HANDED = "RUN_NOT_HANDED"
    # The execution no longer waits for the task (answered, timed out, stopped).
    TASK_GONE = "TASK_GONE"
    PREVIOUS_AGENT_PREFERRED = "PREVIOUS_AGENT_PREFERRED"
    # A project is deleted only once none of its jobs is held, queued or running.
    PROJECT_HAS_LIVE_JOBS = "PROJECT_HAS_LIVE_JOBS"
    # The shards of a job's first stage to check out resolved its ref to different commits (the
    # branch moved between their checkouts): the job has no one commit to build or rerun.
    COMMITS_DIFFER = "COMMITS_DIFFER"
    # A record an agent wrote names a location that is not one of its job's objects (another
    # job's or project's, another bucket, a path trick): nothing is done with it
    # (relevo_core.models.job_objects).
    LOCATION_OUTSIDE_JOB = "LOCATION_OUTSIDE_JOB"
    # A sharded stage's test plan (relevo_core.fleet.test_plans): asked for by a stage without
    # tests.plan; a listing not stored where its sha256 says, or not what its format says; a
    # listing other than the one the stage's plan was made of.
    TEST_PLAN_NOT_DECLARED = "TEST_PLAN_NOT_DECLARED"
    TEST_LISTING_NOT_FOUND = "TEST_LISTING_NOT_FOUND"
    TEST_LISTING_INVALID = "TEST_LISTING_INVALID"
    TEST_LISTING_DIFFERS = "TEST_LISTING_DIFFERS"
    # relevo cache show|delete: the project has no entry of that key in that region.
    CACHE_ENTRY_NOT_FOUND = "CACHE_ENTRY_NOT_FOUND"


ERROR_STATUS: dict[ErrorCode, HTTPStatus] = {
    ErrorCode.CLAIM_REFUSED: HTTPStatus.CONFLICT,
    ErrorCode.DISPATCH_NOT_FOUND: HTTPStatus.NOT_FOUND,
    ErrorCode.ATTEMPT_NOT_HELD: HTTPStatus.CONFLICT,
    ErrorCode.ATTEMPT_ENDED: HTTPStatus.CONFLICT,
    ErrorCode.RUN_NOT_HANDED: HTTPStatus.CONFLICT,
    ErrorCode.TASK_GONE: HTTPStatus.GONE,
    ErrorCode.PREVIOUS_AGENT_PREFERRED: HTTPStatus.CONFLICT,
    ErrorCode.MALFORMED_JSON: HTTPStatus.BAD_REQUEST,
    ErrorCode.VALIDATION_FAILED: HTTPStatus.UNPROCESSABLE_ENTITY,
    ErrorCode.SIGNATURE_INVALID: HTTPStatus.UNAUTHORIZED,
    ErrorCode.ENVELOPE_VERSION_UNSUPPORTED: HTTPStatus.UNPROCESSABLE_ENTITY,
    ErrorCode.PROJECT_NOT_FOUND: HTTPStatus.NOT_FOUND,
    ErrorCode.JOB_NOT_FOUND: HTTPStatus.NOT_FOUND,
    ErrorCode.PAYLOAD_TOO_LARGE: HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
    ErrorCode.QUEUE_FULL: HTTPStatus.TOO_MANY_REQUESTS,
    ErrorCode.FORBIDDEN: HTTPStatus.FORBIDDEN,
    ErrorCode.UNAUTHENTICATED: HTTPStatus.UNAUTHORIZED,
    ErrorCode.REGION_UNKNOWN: HTTPStatus.UNPROCESSABLE_ENTITY,
    # The project names a secret Relevo cannot read: a configuration fault, not the caller's.
    ErrorCode.SECRET_UNAVAILABLE: HTTPStatus.SERVICE_UNAVAILABLE,
    ErrorCode.JOB_NOT_HELD: HTTPStatus.CONFLICT,
    ErrorCode.JOB_ALREADY_ENDED: HTTPStatus.CONFLICT,
    ErrorCode.DLQ_ENTRY_NOT_FOUND: HTTPStatus.NOT_FOUND,
    ErrorCode.JOB_NOT_WAITING: HTTPStatus.CONFLICT,
    ErrorCode.STAGE_UNKNOWN: HTTPStatus.UNPROCESSABLE_ENTITY,
    ErrorCode.ROUTE_NOT_FOUND: HTTPStatus.NOT_FOUND,
    ErrorCode.THROTTLED: HTTPStatus.TOO_MANY_REQUESTS,
    ErrorCode.REQUEST_REFUSED: HTTPStatus.BAD_REQUEST,
    ErrorCode.STAGE_NOT_IN_REVIEW: HTTPStatus.CONFLICT,
    # Automatic runs of an idempotency key that kept dead-lettering are refused until unfrozen.
    ErrorCode.KEY_FROZEN: HTTPStatus.CONFLICT,
    ErrorCode.KEY_NOT_FROZEN: HTTPStatus.NOT_FOUND,
    ErrorCode.JOB_NOT_QUEUED: HTTPStatus.CONFLICT,
    ErrorCode.JOB_NOT_ENDED: HTTPStatus.CONFLICT,
    # A held job has no execution (yet) to count the cost of.
    ErrorCode.JOB_NOT_STARTED: HTTPStatus.CONFLICT,
    # A promote past the highest priority there is (the queue's top already holds it).
    ErrorCode.PRIORITY_OUT_OF_RANGE: HTTPStatus.CONFLICT,
    # A query string a route cannot read (GET /jobs/{id}/logs: from_seq, before_seq, limit).
    ErrorCode.QUERY_INVALID: HTTPStatus.BAD_REQUEST,
    ErrorCode.ARTIFACT_NOT_FOUND: HTTPStatus.NOT_FOUND,
    # Two stages of the job left a file of that name: the caller names the stage.
    ErrorCode.ARTIFACT_AMBIGUOUS: HTTPStatus.CONFLICT,
    ErrorCode.ARTIFACT_REMOVED: HTTPStatus.GONE,
    ErrorCode.PLAN_TOO_LARGE: HTTPStatus.UNPROCESSABLE_ENTITY,
    ErrorCode.GROUP_NOT_FOUND: HTTPStatus.NOT_FOUND,
    ErrorCode.CACHE_ENTRY_NOT_FOUND: HTTPStatus.NOT_FOUND,
    ErrorCode.AGENT_NOT_FOUND: HTTPStatus.NOT_FOUND,
    ErrorCode.HANDOFF_EXPIRED: HTTPStatus.GONE,
    ErrorCode.PROJECT_HAS_LIVE_JOBS: HTTPStatus.CONFLICT,
    ErrorCode.COMMITS_DIFFER: HTTPStatus.CONFLICT,
    # The request is sound; the job's stored record is not: no link is given for it.
    ErrorCode.LOCATION_OUTSIDE_JOB: HTTPStatus.CONFLICT,
    ErrorCode.TEST_PLAN_NOT_DECLARED: HTTPStatus.CONFLICT,
    ErrorCode.TEST_LISTING_NOT_FOUND: HTTPStatus.NOT_FOUND,
    ErrorCode.TEST_LISTING_INVALID: HTTPStatus.UNPROCESSABLE_ENTITY,
    ErrorCode.TEST_LISTING_DIFFERS: HTTPStatus.CONFLICT,
}


class RelevoError(Exception):
    """A refusal with a stable code; `status` is what an HTTP caller sees."""

    def __init__(self, code: ErrorCode, message: str, **details: object) -> None:
        super().__init__(f"{code.value}: {message}")
        self.code = code
        self.message = message
        self.details = details

    @property
    def status(self) -> HTTPStatus:
        return ERROR_STATUS[self.code]

    def to_body(self) -> dict[str, object]:
        body: dict[str, object] = {"error": self.code.value, "message": self.message}
        if self.details:
            body["details"] = self.details
        return body


class ErrorClass(str, Enum):
    """Why a stage attempt failed. The name is the Step Functions error name of the failure."""

    # Retryable
    NETWORK_TIMEOUT = "Relevo.Transient.NetworkTimeout"
    CONNECTION_RESET = "Relevo.Transient.ConnectionReset"
    STORAGE_5XX = "Relevo.Transient.Storage5xx"
    TRANSIENT_EXIT = "Relevo.Transient.ExitCode"
    AGENT_SHUTDOWN = "Relevo.Transient.AgentShutdown"
    LEASE_EXPIRED = "Relevo.Lease.Expired"
    # Non-retryable
    CERTIFICATE_EXPIRED = "Relevo.Fatal.CertificateExpired"
    PROFILE_MISMATCH = "Relevo.Fatal.ProfileMismatch"
    TOOLCHAIN_DRIFT = "Relevo.Fatal.ToolchainDrift"
    CHECKSUM = "Relevo.Fatal.Checksum"
    CLIENT_4XX = "Relevo.Fatal.Client4xx"
    COMMAND_FAILED = "Relevo.Fatal.ExitCode"
    # The stage's artifacts would take the job past its project's artifact.max_job_bytes.
    ARTIFACT_QUOTA = "Relevo.Fatal.ArtifactQuota"
    # A stage of a job with signing.keychain: temporary on an agent that cannot make a keychain
    # (not macOS, and no security_tool in its config): never run unsigned.
    KEYCHAIN_UNSUPPORTED = "Relevo.Fatal.KeychainUnsupported"
    # Its signing keychain could not be made: an identity unreadable or stored wrong, or a
    # `security` command failed.
    KEYCHAIN_FAILED = "Relevo.Fatal.Keychain"
    # The checkout could not make the workspace the job's commit for good: the commit is not in the
    # repository, the credentials were refused, the repository or the ref does not exist.
    # (Network trouble and timeouts of the fetch are the transient classes above.)
    CHECKOUT_FAILED = "Relevo.Fatal.Checkout"
    # A path the stage declares under `handoff:` matched nothing when its command ended: a build
    # that "succeeded" without its output has failed.
    HANDOFF_MISSING = "Relevo.Fatal.HandoffMissing"
    # A handed-on path would lead out of the workspace (a symlink above it, a link target outside),
    # at store or in a manifest at restore; or the artifact directory was replaced by a link.
    HANDOFF_PATH = "Relevo.Fatal.HandoffPath"
    # An earlier stage's handoff is no longer stored (expired, removed by artifact.max_total_bytes).
    HANDOFF_GONE = "Relevo.Fatal.HandoffGone"
    # Two shards of an earlier stage hand on the same path differently: a later stage cannot
    # restore both (relevo_agent.handoff.manifests.check_shards_apart).
    HANDOFF_CONFLICT = "Relevo.Fatal.HandoffConflict"
    # What the stage wrote to $RELEVO_OUTPUT is not key=value / heredoc lines, or is over a limit.
    OUTPUT_INVALID = "Relevo.Fatal.Output"
    # A release effect refused before anything was submitted (docs/release-effects.md): its API
    # key missing, malformed or refused (401), an app Apple does not know, a file whose version or
    # build number cannot be read, a build number Apple already has for that version.
    EFFECT_REFUSED = "Relevo.Fatal.EffectRefused"
    # The effect happened and Apple (or the host) turned it down for good: a notarization Invalid
    # (Apple's log attached), a build upload whose processing FAILED.
    EFFECT_REJECTED = "Relevo.Fatal.EffectRejected"
    # A sharded stage's test plan (docs/test-results.md, "The plan"): a shard ran fewer of its
    # planned tests than it was given (or was given none, and the plan does not allow_empty) ...
    TESTS_MISSING = "Relevo.Fatal.TestsMissing"
    # ... ran one twice, or one it was not given ...
    TESTS_UNPLANNED = "Relevo.Fatal.TestsUnplanned"
    # ... or its listing could not be made or read, or is not the one the stage's plan was made of.
    TEST_PLAN = "Relevo.Fatal.TestPlan"
    PRECONDITION_CHANGED = "Relevo.Precondition.Changed"
    # Reconciliation found an effect it cannot tie to the operation: the stage waits for an
    # operator (relevo job resolve); resolved as failed, it fails with the second name.
    MANUAL_REVIEW = "Relevo.Reconcile.ManualReview"
    RESOLVED_FAILED = "Relevo.Reconcile.ResolvedFailed"
    # Timeouts, each with its own name
    QUEUE_TIMEOUT = "Relevo.Timeout.Queue"
    EXEC_TIMEOUT = "Relevo.Timeout.Exec"
    # Approval gate outcomes
    APPROVAL_REJECTED = "Relevo.Approval.Rejected"
    APPROVAL_TIMEOUT = "Relevo.Approval.Timeout"

    @property
    def retryable(self) -> bool:
        return self in RETRYABLE_CLASSES


RETRYABLE_CLASSES: frozenset[ErrorClass] = frozenset(
    {
        ErrorClass.NETWORK_TIMEOUT,
        ErrorClass.CONNECTION_RESET,
        ErrorClass.STORAGE_5XX,
        ErrorClass.TRANSIENT_EXIT,
        ErrorClass.AGENT_SHUTDOWN,
        ErrorClass.LEASE_EXPIRED,
    }
)

# Exit code 75 is EX_TEMPFAIL (sysexits.h): the one exit code transient by default.
EX_TEMPFAIL = 75
