"""The API's request models: every body and query string a route reads, validated here before
any logic runs. The OpenAPI document attaches them to their operations (relevo_core/openapi.py)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from relevo_core.models.envelope import PRIORITY_BOUND, STAGE_NAME, TriggerType
from relevo_core.models.errors import ErrorCode, RelevoError
from relevo_core.models.status import JobStatus

# GET /jobs: rows per page at most.
JOB_LIST_MAX_LIMIT = 500
# GET /jobs/{id}/logs: chunks per page, by default and at most.
LOG_DEFAULT_LIMIT = 100
LOG_MAX_LIMIT = 1000
# Seqs are stored zero-padded to 12 digits (store/keys.py log_sk): larger ones would not sort.
MAX_SEQ = 10**12 - 1
# A place in a job's log (relevo_core.jobs.logs): the job's own seq, then `<stage>.<shard>:<seq>` of
# each shard's log partition past its start (a job has at most 45 shards: plan_limits).
LOG_CURSOR = r"^(0|[1-9][0-9]{0,11})(,[0-9]{2}\.[0-9]{2}:[0-9]{1,12}){0,45}$"


def problems_of(exc: ValidationError, where: str) -> str:
    """Each offending field of a query string or body, `field: problem; ...`."""
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or where}: {e['msg']}" for e in exc.errors())


class RunRequest(BaseModel):
    """POST /projects/{id}/run"""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ref: str | None = Field(default=None, min_length=1, max_length=256)
    commit: str | None = Field(default=None, pattern=r"^[0-9a-f]{7,64}$")
    stages: list[str] | None = Field(default=None, min_length=1, max_length=32)
    priority: int | None = Field(default=None, ge=-1_000_000, le=1_000_000)
    trigger: Literal["api", "manual"] = "api"
    # Two requests with the same request_id are the same request (a retried CLI call); a new
    # request_id asks for a new run even inside the dedup window.
    request_id: str | None = Field(default=None, min_length=1, max_length=128)


class RerunRequest(BaseModel):
    """POST /jobs/{id}/rerun"""

    model_config = ConfigDict(extra="forbid", frozen=True)

    from_stage: str | None = Field(default=None, pattern=STAGE_NAME)


# Body of POST /jobs/{job_id}/approve and /reject.
class ApprovalDecision(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    reason: str | None = Field(default=None, max_length=2048)


# Body of POST /jobs/{job_id}/stages/{stage}/resolve.
class Resolution(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    as_: Literal["succeeded", "retry", "failed"] = Field(alias="as")
    reason: str | None = Field(default=None, max_length=2048)
    # Which shard of a stage with shards (0-based): each shard is reviewed on its own record.
    shard: int | None = Field(default=None, ge=0)


_Body = TypeVar("_Body", bound="BodyModel")


class BodyModel(BaseModel):
    """A route's JSON body: `from_body` validates it, a mistake is 422 VALIDATION_FAILED."""

    @classmethod
    def from_body(cls: type[_Body], body: Any) -> _Body:
        try:
            return cls.model_validate(body if body is not None else {})
        except ValidationError as exc:
            raise RelevoError(ErrorCode.VALIDATION_FAILED, problems_of(exc, "body")) from exc


class PriorityRequest(BodyModel):
    """Body of `POST /jobs/{job_id}/priority`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    priority: int = Field(ge=-PRIORITY_BOUND, le=PRIORITY_BOUND, description="higher runs first")


# Pause and drain: 5 minutes unless told, a week at most (issue 20).
PAUSE_DEFAULT_SEC = 300
PAUSE_MAX_SEC = 7 * 24 * 3600


class PauseRequest(BodyModel):
    """Body of `POST /agents/{agent_id}/pause` and `POST /regions/{region}/pause`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    note: str = Field(
        default="", max_length=500, description='why, shown with the pause (e.g. "Xcode update")'
    )
    timeout_sec: int = Field(
        default=PAUSE_DEFAULT_SEC,
        ge=1,
        le=PAUSE_MAX_SEC,
        description="the pause ends by itself after this long",
    )
    drain: bool = Field(default=False, description="agents only: also exit once no stage runs (for launchd)")
    region: str | None = Field(
        default=None,
        min_length=1,
        max_length=32,
        description="agents only: the agent's region affinity; default: the region of its presence record",
    )


class JobListQuery(BaseModel):
    """Query string of `GET /jobs` (every filter optional; they combine with AND)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    project: str | None = Field(default=None, min_length=1, max_length=64)
    group: str | None = Field(
        default=None, min_length=1, max_length=64, description="jobs of the projects in this project group"
    )
    q: str | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        description="keyword: a case-insensitive part of the job id, project, ref, commit, trigger source "
        "or actor",
    )
    status: JobStatus | None = None
    trigger: TriggerType | None = None
    agent: str | None = Field(default=None, min_length=1, max_length=128)
    region: str | None = Field(default=None, min_length=1, max_length=64)
    since: datetime | None = None
    until: datetime | None = None
    limit: int = Field(default=50, ge=1, le=JOB_LIST_MAX_LIMIT)

    @field_validator("since", "until")
    @classmethod
    def _utc(cls, value: datetime | None) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)

    @classmethod
    def from_query_string(cls, params: dict[str, str] | None) -> JobListQuery:
        try:
            return cls.model_validate(params or {})
        except ValidationError as exc:
            raise RelevoError(ErrorCode.VALIDATION_FAILED, problems_of(exc, "query")) from exc


class ArtifactQuery(BaseModel):
    """Query string of `GET /jobs/{job_id}/artifacts/{name}`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    stage: str | None = Field(
        default=None, min_length=1, max_length=64, description="the stage that left the file"
    )
    shard: int | None = Field(
        default=None, ge=0, description="the shard (0-based index) of a stage with shards that left the file"
    )


Query = TypeVar("Query", bound=BaseModel)


def parse_query(model: type[Query], params: dict[str, str] | None) -> Query:
    """A route's query string read with its model; what does not fit is 400 QUERY_INVALID."""
    try:
        return model.model_validate(params or {})
    except ValidationError as exc:
        raise RelevoError(ErrorCode.QUERY_INVALID, problems_of(exc, "query")) from exc


class LogQuery(BaseModel):
    """Query string of `GET /jobs/{job_id}/logs`: at most one of from_seq / before_seq; neither
    reads from the start of the log."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # Cursors (a page's next_seq / before_seq, a chunk's next): a plain seq for a job without shards.
    from_seq: str | None = Field(
        default=None,
        pattern=LOG_CURSOR,
        description="page forward: the chunks from this cursor on (a page's next_seq)",
    )
    before_seq: str | None = Field(
        default=None,
        pattern=LOG_CURSOR,
        description="page back: the last chunks before this cursor (a page's before_seq)",
    )
    limit: int = Field(
        default=LOG_DEFAULT_LIMIT, ge=1, le=LOG_MAX_LIMIT, description="at most this many chunks"
    )

    @model_validator(mode="after")
    def _one_direction(self) -> LogQuery:
        if self.from_seq is not None and self.before_seq is not None:
            raise ValueError("give from_seq (page forward) or before_seq (page back), not both")
        return self


TESTS_DEFAULT_LIMIT = 100
TESTS_MAX_LIMIT = 500
TESTS_MAX_SLOWEST = 50


class JobTestsQuery(BaseModel):
    """Query string of `GET /jobs/{job_id}/tests` (relevo_core.jobs.results_listing)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    status: Literal["failed", "flaky", "skipped", "passed"] | None = Field(
        default=None,
        description="only these: failed (failed or error), flaky (failed, then passed), skipped, passed",
    )
    limit: int = Field(
        default=TESTS_DEFAULT_LIMIT, ge=1, le=TESTS_MAX_LIMIT, description="at most this many tests"
    )
    page_token: str | None = Field(
        default=None,
        max_length=200,
        pattern=r"^[A-Za-z0-9_-]+$",
        description="the next page: a page's next_page_token (of the same status filter)",
    )
    slowest: int = Field(
        default=10, ge=0, le=TESTS_MAX_SLOWEST, description="how many of the slowest tests to list"
    )


class DeliveryListQuery(BaseModel):
    """Query string of `GET /deliveries`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    project: str | None = Field(default=None, pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")
    failed: bool = False
