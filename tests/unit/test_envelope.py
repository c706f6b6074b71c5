"""The job envelope contract: lossless round trips, version gate, validation, error codes and classes."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta, timezone
from http import HTTPStatus
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from relevo_core.config import IntakeSettings
from relevo_core.intake.enqueue import build_envelope
from relevo_core.models.envelope import (
    PROJECT_ID,
    REGION_AFFINITY,
    SUPPORTED_SCHEMA_VERSIONS,
    JobEnvelope,
    Trigger,
    TriggerType,
    new_job_id,
    read_envelope,
)
from relevo_core.models.errors import ERROR_STATUS, ErrorClass, ErrorCode, RelevoError
from relevo_core.models.plan import (
    DEFAULT_ATTEMPTS,
    MAX_ATTEMPTS,
    STAGE_NAME,
    ApprovalSettings,
    OutputRule,
    RetryPolicy,
    StagePlan,
)
from relevo_core.models.project import Project
from relevo_core.models.status import JobStatus
from relevo_core.store.codec import envelope_of, from_attributes, to_attributes
from relevo_core.store.job_creation import job_item

# --------------------------------------------------------------------------------------------
# Strategies: every field of a valid envelope, within the model's own bounds.
# --------------------------------------------------------------------------------------------


def bounded_text(min_size: int, max_size: int) -> st.SearchStrategy[str]:
    """Arbitrary unicode, minus lone surrogates (pydantic refuses those as strings, see below)."""
    return st.text(alphabet=st.characters(exclude_categories=("Cs",)), min_size=min_size, max_size=max_size)


stage_names = st.from_regex(STAGE_NAME, fullmatch=True)
job_ids = st.floats(min_value=0, max_value=4_000_000_000, allow_nan=False).map(new_job_id)
projects = st.from_regex(PROJECT_ID, fullmatch=True)
regions = st.from_regex(REGION_AFFINITY, fullmatch=True)
artifact_uris = st.from_regex(r"^s3://[a-z0-9.-]{3,63}/.*$", fullmatch=True)
commits = st.from_regex(r"^[0-9a-f]{7,64}$", fullmatch=True)
attempt_counts = st.integers(min_value=1, max_value=MAX_ATTEMPTS)
timeouts = st.integers(min_value=1, max_value=86_400)

# Fixed-offset zones (no tzdata needed); the validator normalises to UTC either way.
zones = st.integers(min_value=-(24 * 60 - 1), max_value=24 * 60 - 1).map(
    lambda minutes: timezone(timedelta(minutes=minutes))
)
# Kept away from datetime.min/max so that the conversion to UTC cannot overflow.
created_ats = st.datetimes(min_value=datetime(1971, 1, 1), max_value=datetime(2200, 1, 1), timezones=zones)

output_rules = st.builds(
    OutputRule,
    # re.escape of any text always compiles; plus a few real-world patterns.
    pattern=st.one_of(
        bounded_text(1, 200).map(re.escape),
        st.sampled_from([r"ECONNRESET", r"(?i)certificate.*expired", r"^error: \d+$", r"5\d\d Server"]),
    ),
    error_class=st.sampled_from(ErrorClass),
)

retry_policies = st.builds(
    RetryPolicy,
    transient_exit_codes=st.lists(st.integers(min_value=1, max_value=255), max_size=6).map(tuple),
    output_rules=st.lists(output_rules, max_size=4).map(tuple),
    attempts=st.dictionaries(st.sampled_from(ErrorClass), attempt_counts, max_size=6),
    default_attempts=attempt_counts,
)

triggers = st.builds(
    Trigger,
    type=st.sampled_from(TriggerType),
    source=bounded_text(1, 64),
    delivery_id=st.none() | bounded_text(0, 128),
    actor=st.none() | bounded_text(0, 512),
)


@st.composite
def stage_plans(draw: st.DrawFn) -> tuple[StagePlan, ...]:
    names = draw(st.lists(stage_names, min_size=1, max_size=32, unique=True))
    return tuple(
        StagePlan(
            name=name,
            command=draw(bounded_text(1, 300)),
            exec_timeout_sec=draw(timeouts),
            retry=draw(retry_policies),
            effect_probe=draw(st.none() | bounded_text(0, 300)),
        )
        for name in names
    )


@st.composite
def envelopes(draw: st.DrawFn) -> JobEnvelope:
    stages = draw(stage_plans())
    names = [stage.name for stage in stages]
    optional_stage = st.none() | st.sampled_from(names)
    return JobEnvelope(
        job_id=draw(job_ids),
        idempotency_key=draw(bounded_text(1, 512)),
        project=draw(projects),
        region_affinity=draw(regions),
        artifact_uri=draw(artifact_uris),
        created_at=draw(created_ats),
        ttl=draw(st.integers(min_value=1, max_value=10**11 - 1)),
        log_ttl=draw(st.none() | st.integers(min_value=1, max_value=10**11 - 1)),
        trigger=draw(triggers),
        priority=draw(st.integers(min_value=-1_000_000, max_value=1_000_000)),
        ref=draw(bounded_text(1, 256)),
        commit=draw(st.none() | commits),
        stages=stages,
        queue_timeout_sec=draw(timeouts),
        exec_timeout_sec=draw(timeouts),
        lease_ttl_sec=draw(st.integers(min_value=3, max_value=3600)),
        # An enabled gate must name its stage here (generated names are rarely deploy stages).
        approval=draw(
            st.builds(
                ApprovalSettings,
                enabled=st.just(False),
                before=optional_stage,
                timeout_minutes=st.integers(min_value=0, max_value=7 * 24 * 60),
            )
            | st.builds(
                ApprovalSettings,
                enabled=st.just(True),
                before=st.sampled_from(names),
                timeout_minutes=st.integers(min_value=0, max_value=7 * 24 * 60),
                timeout_sec=st.none() | st.integers(min_value=1, max_value=7 * 24 * 3600),
            )
        ),
        from_stage=draw(optional_stage),
        retry_of=draw(st.none() | job_ids),
    )


def minimal_envelope(**overrides: Any) -> dict[str, Any]:
    """A small valid envelope in JSON form."""
    body: dict[str, Any] = {
        "schema_version": 1,
        "job_id": new_job_id(1_700_000_000.0),
        "idempotency_key": "demo:abc1234:0011223344556677",
        "project": "demo",
        "region_affinity": "eu-west-1",
        "artifact_uri": "s3://relevo-artifacts/demo/job/",
        "created_at": "2024-05-01T12:00:00+00:00",
        "ttl": 1_720_000_000,
        "trigger": {"type": "webhook", "source": "github", "delivery_id": "d-1"},
        "ref": "refs/heads/main",
        "commit": "abc1234",
        "stages": [{"name": "build", "command": "make"}, {"name": "deploy", "command": "make deploy"}],
    }
    body.update(overrides)
    return body


def refusal(data: dict[str, Any]) -> RelevoError:
    with pytest.raises(RelevoError) as caught:
        read_envelope(data)
    return caught.value


# --------------------------------------------------------------------------------------------
# Round trips
# --------------------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(envelope=envelopes())
def test_any_valid_envelope_round_trips_through_json_and_dynamodb(envelope: JobEnvelope) -> None:
    """Given any valid envelope, when it goes through JSON or DynamoDB item form and back through
    read_envelope, then the model read back equals the original."""
    via_json = read_envelope(json.loads(envelope.model_dump_json()))
    assert via_json == envelope

    item = to_attributes({"envelope": envelope.to_json_dict()})
    via_dynamo = read_envelope(from_attributes(item)["envelope"])
    assert via_dynamo == envelope


@settings(max_examples=50, deadline=None)
@given(envelope=envelopes())
def test_created_at_is_read_back_in_utc(envelope: JobEnvelope) -> None:
    """Given an envelope created with any UTC offset, when read back, then created_at is UTC."""
    assert envelope.created_at.utcoffset() == timedelta(0)
    assert read_envelope(json.loads(envelope.model_dump_json())).created_at.utcoffset() == timedelta(0)


def test_ttl_is_bounded_to_what_dynamodb_can_store() -> None:
    """Given a ttl that is not a plausible epoch second (beyond 10**11), when read, then it is
    refused with VALIDATION_FAILED rather than failing later at the store."""
    assert refusal(minimal_envelope(ttl=10**40)).code is ErrorCode.VALIDATION_FAILED


def test_log_chunks_expire_at_log_ttl_or_with_the_job_in_an_envelope_from_before_it() -> None:
    """Given envelopes with and without log_ttl (those written before it existed), then their
    chunks' TTL is log_ttl, or the job's own ttl; a log_ttl DynamoDB cannot store is refused."""
    assert read_envelope(minimal_envelope(log_ttl=1_710_000_000)).log_expires_at == 1_710_000_000
    assert read_envelope(minimal_envelope()).log_expires_at == 1_720_000_000
    assert refusal(minimal_envelope(log_ttl=10**40)).code is ErrorCode.VALIDATION_FAILED


def test_a_new_jobs_ttl_and_log_ttl_count_the_stacks_retention_days_from_its_creation() -> None:
    """Given the stack's JobRetentionDays and LogRetentionDays in a function's environment, when
    intake builds an envelope, then ttl and log_ttl are created_at plus those days."""
    settings = IntakeSettings.model_validate(
        {
            "TABLE_NAME": "relevo-table",
            "STATE_MACHINE_ARN": "arn:aws:states:us-east-1:123456789012:stateMachine:job",
            "QUEUED_STATE_MACHINE_ARN": "arn:aws:states:us-east-1:123456789012:stateMachine:job-queued",
            "ARTIFACT_BUCKET": "relevo-artifacts",
            "WORK_QUEUE_PREFIX": "relevo-work-",
            "JOB_RETENTION_DAYS": "9",
            "LOG_RETENTION_DAYS": "2",
        }
    )
    project = Project.model_validate(
        {
            "id": "demo",
            "repo": "acme/demo",
            "region_affinity": "eu-west",
            "stages": [{"name": "build", "run": "make"}],
        }
    )
    created = datetime(2026, 11, 29, 12, 0, 0, 500_000, tzinfo=UTC)
    envelope = build_envelope(
        settings,
        project,
        Trigger(type="api", source="api"),
        "main",
        None,
        project.frozen_stages(),
        "k",
        created,
    )
    epoch = int(created.timestamp())
    assert (envelope.ttl, envelope.log_ttl) == (epoch + 9 * 86400, epoch + 2 * 86400)
    # The defaults are the template's: 30 days for jobs, 14 for logs.
    defaults = IntakeSettings.model_validate(
        settings.model_dump(by_alias=True, exclude={"job_retention_days", "log_retention_days"})
    )
    assert defaults.expiry(created) == {"ttl": epoch + 30 * 86400, "log_ttl": epoch + 14 * 86400}


def test_minimal_envelope_is_valid() -> None:
    """Given the minimal fixture, when read, then it parses with the documented defaults."""
    envelope = read_envelope(minimal_envelope())
    assert envelope.priority == 0
    assert envelope.stages[0].retry == RetryPolicy()
    assert envelope.approval.effective_timeout_sec == 24 * 3600


def test_missing_region_affinity_is_refused_naming_the_field() -> None:
    """Given an envelope without region_affinity, when read, then VALIDATION_FAILED names it."""
    data = minimal_envelope()
    del data["region_affinity"]
    error = refusal(data)
    assert error.code is ErrorCode.VALIDATION_FAILED
    assert "region_affinity" in error.message
    assert error.status == HTTPStatus.UNPROCESSABLE_ENTITY
    assert any(problem["field"] == "region_affinity" for problem in error.details["problems"])


@pytest.mark.parametrize("version", [9, 0, "1", None, True, 1.0, -1])
def test_unknown_schema_version_is_refused(version: object) -> None:
    """Given an otherwise valid envelope with an unknown schema_version, when read, then it is
    refused with ENVELOPE_VERSION_UNSUPPORTED."""
    error = refusal(minimal_envelope(schema_version=version))
    assert error.code is ErrorCode.ENVELOPE_VERSION_UNSUPPORTED
    assert error.status == HTTPStatus.UNPROCESSABLE_ENTITY


def test_new_envelopes_are_version_7_and_older_envelopes_still_read() -> None:
    """Version 2 added log_ttl, version 3 a stage's aws_profile, version 4 checkout and a stage's
    handoff, version 5 a stage's warning_exit_codes, version 6 a stage's effect_resume and the
    job's build_number: new envelopes carry 6, so an agent that knows only an older version refuses
    them with ENVELOPE_VERSION_UNSUPPORTED instead of running a stage without its profile, on whatever
    its workspace holds, failing a stage that exited with a warning code, holding for a person an
    effect its probe finds in progress, or running one without its build number; version 7 a stage's
    built-in effect (no command: an agent ignoring it would run nothing); version 1 to 6 envelopes
    read as before."""
    old = read_envelope(minimal_envelope(schema_version=1))
    assert old.schema_version == 1 and old.log_ttl is None and old.log_expires_at == old.ttl
    two = read_envelope(minimal_envelope(schema_version=2, log_ttl=1_710_000_000))
    assert two.schema_version == 2
    assert (
        JobEnvelope.model_validate(
            {k: v for k, v in old.to_json_dict().items() if k != "schema_version"}
        ).schema_version
        == 8
    )
    three = read_envelope(minimal_envelope(schema_version=3))
    assert (
        three.schema_version == 3
        and three.checkout is None
        and all(stage.handoff == () for stage in three.stages)
    )
    four = read_envelope(minimal_envelope(schema_version=4))
    assert four.schema_version == 4 and all(stage.warning_exit_codes == () for stage in four.stages)
    five = read_envelope(minimal_envelope(schema_version=5))
    assert five.schema_version == 5 and all(stage.effect_resume is None for stage in five.stages)
    assert five.build_number is None
    six = read_envelope(minimal_envelope(schema_version=6))
    assert six.schema_version == 6 and all(stage.effect is None for stage in six.stages)


def test_missing_schema_version_is_refused() -> None:
    """Given an envelope with no schema_version at all, when read, then the version gate refuses it
    (the model's default version is never assumed for foreign data)."""
    data = minimal_envelope()
    del data["schema_version"]
    assert refusal(data).code is ErrorCode.ENVELOPE_VERSION_UNSUPPORTED


def test_unknown_version_is_refused_before_the_body_is_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    """Given the version after the newest with a garbage body, when read, then the refusal is about
    the version, and the model validator is never reached."""
    calls: list[object] = []
    monkeypatch.setattr(JobEnvelope, "model_validate", classmethod(lambda cls, data: calls.append(data)))
    unknown = max(SUPPORTED_SCHEMA_VERSIONS) + 1
    garbage = {
        "schema_version": unknown,
        "stages": "not a list",
        "job_id": 7,
        "totally": {"unknown": object()},
    }
    error = refusal(garbage)
    assert error.code is ErrorCode.ENVELOPE_VERSION_UNSUPPORTED
    assert error.details["schema_version"] == unknown
    assert calls == []


def test_duplicate_stage_names_are_refused() -> None:
    """Given two stages with the same name, when read, then VALIDATION_FAILED names the repeat."""
    stages = [{"name": "build", "command": "a"}, {"name": "build", "command": "b"}]
    error = refusal(minimal_envelope(stages=stages))
    assert error.code is ErrorCode.VALIDATION_FAILED
    assert "repeated: build" in error.message


def test_an_enabled_gate_defaults_to_the_first_deploy_stage_or_is_refused() -> None:
    """Given approval enabled without `before`, the gate is the first deploy stage; without any
    deploy stage the plan is refused, naming the field."""
    stages = [
        {"name": "build", "command": "make"},
        {"name": "deploy-prod", "command": "ship"},
        {"name": "deploy-eu", "command": "ship"},
    ]
    envelope = read_envelope(minimal_envelope(stages=stages, approval={"enabled": True}))
    assert envelope.approval.gated_stage([s.name for s in envelope.stages]) == "deploy-prod"
    no_deploy = [{"name": "build", "command": "make"}, {"name": "sign", "command": "codesign"}]
    error = refusal(minimal_envelope(stages=no_deploy, approval={"enabled": True}))
    assert error.code is ErrorCode.VALIDATION_FAILED and "approval.before" in error.message


def test_approval_before_unknown_stage_is_refused() -> None:
    """Given approval.before naming a stage the plan does not have, when read, then it is refused."""
    error = refusal(minimal_envelope(approval={"enabled": True, "before": "ship"}))
    assert error.code is ErrorCode.VALIDATION_FAILED
    assert "approval.before" in error.message and "ship" in error.message


def test_from_stage_unknown_stage_is_refused() -> None:
    """Given from_stage naming a stage the plan does not have, when read, then it is refused."""
    error = refusal(minimal_envelope(from_stage="ship"))
    assert error.code is ErrorCode.VALIDATION_FAILED
    assert "from_stage" in error.message


@pytest.mark.parametrize(
    "where",
    ["envelope", "trigger", "stage", "retry", "approval"],
)
def test_unknown_fields_are_refused_everywhere(where: str) -> None:
    """Given an unknown field at any level of the envelope, when read, then extra="forbid" refuses
    it and the message names the field."""
    data = minimal_envelope()
    if where == "envelope":
        data["surprise"] = 1
    elif where == "trigger":
        data["trigger"] = {**data["trigger"], "surprise": 1}
    elif where == "stage":
        data["stages"] = [{**data["stages"][0], "surprise": 1}]
    elif where == "retry":
        data["stages"] = [{**data["stages"][0], "retry": {"surprise": 1}}]
    else:
        data["approval"] = {"surprise": 1}
    error = refusal(data)
    assert error.code is ErrorCode.VALIDATION_FAILED
    assert "surprise" in error.message


def test_naive_created_at_is_refused() -> None:
    """Given a created_at without a time zone, when read, then it is refused."""
    error = refusal(minimal_envelope(created_at="2024-05-01T12:00:00"))
    assert error.code is ErrorCode.VALIDATION_FAILED
    assert "created_at" in error.message


def test_lone_surrogate_in_a_command_is_refused() -> None:
    """Given a command holding a lone UTF-16 surrogate (json.loads accepts "\\ud800"), when read,
    then it is refused, so every valid envelope is encodable as JSON."""
    data = minimal_envelope(stages=[{"name": "build", "command": json.loads('"echo \\ud800"')}])
    assert refusal(data).code is ErrorCode.VALIDATION_FAILED


def test_envelope_is_immutable() -> None:
    """Given a parsed envelope, when a field is assigned, then pydantic refuses (frozen)."""
    envelope = read_envelope(minimal_envelope())
    with pytest.raises(ValidationError):
        envelope.priority = 5  # type: ignore[misc]  # the write refused


def test_stage_lookup_by_name() -> None:
    """Given an envelope, when a stage is looked up, then known names resolve and unknown raise KeyError."""
    envelope = read_envelope(minimal_envelope())
    assert envelope.stage("deploy").command == "make deploy"
    with pytest.raises(KeyError):
        envelope.stage("ship")


# --------------------------------------------------------------------------------------------
# Error codes and classes
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "status"),
    [
        (ErrorCode.SIGNATURE_INVALID, 401),
        (ErrorCode.QUEUE_FULL, 429),
        (ErrorCode.PAYLOAD_TOO_LARGE, 413),
        (ErrorCode.MALFORMED_JSON, 400),
        (ErrorCode.FORBIDDEN, 403),
        (ErrorCode.VALIDATION_FAILED, 422),
        (ErrorCode.ENVELOPE_VERSION_UNSUPPORTED, 422),
    ],
)
def test_error_code_http_status(code: ErrorCode, status: int) -> None:
    """Given a refusal code, when its HTTP status is asked, then it is the published one."""
    assert RelevoError(code, "x").status == status


@pytest.mark.parametrize("code", list(ErrorCode))
def test_every_error_code_has_a_status_and_a_body(code: ErrorCode) -> None:
    """Given any ErrorCode, when a refusal is built, then it has an HTTP status and a stable body."""
    assert code in ERROR_STATUS
    error = RelevoError(code, "why", hint="h")
    assert 400 <= error.status < 600
    assert error.to_body() == {"error": code.value, "message": "why", "details": {"hint": "h"}}


def test_refusal_body_omits_empty_details() -> None:
    """Given a refusal with no details, when rendered, then the body has no details key."""
    assert RelevoError(ErrorCode.FORBIDDEN, "no").to_body() == {"error": "FORBIDDEN", "message": "no"}


@pytest.mark.parametrize("error_class", list(ErrorClass))
def test_retryable_exactly_for_transient_and_lease_expired(error_class: ErrorClass) -> None:
    """Given any error class, when asked whether it is retryable, then only Relevo.Transient.* and
    Relevo.Lease.Expired are."""
    name = error_class.value
    expected = name.startswith("Relevo.Transient.") or name == "Relevo.Lease.Expired"
    assert error_class.retryable is expected


@pytest.mark.parametrize("error_class", [c for c in ErrorClass if not c.retryable])
def test_non_retryable_class_gets_one_attempt_even_if_configured_higher(error_class: ErrorClass) -> None:
    """Given a policy that asks for 5 attempts of a non-retryable class, when asked, then it gets 1."""
    policy = RetryPolicy(attempts={error_class: 5}, default_attempts=5)
    assert policy.attempts_for(error_class) == 1


def test_retryable_class_gets_default_or_configured_attempts() -> None:
    """Given retryable classes, when asked, then the default is 3 and per-class settings win."""
    assert DEFAULT_ATTEMPTS == 3
    assert RetryPolicy().attempts_for(ErrorClass.NETWORK_TIMEOUT) == 3
    policy = RetryPolicy(attempts={ErrorClass.LEASE_EXPIRED: 5}, default_attempts=2)
    assert policy.attempts_for(ErrorClass.LEASE_EXPIRED) == 5
    assert policy.attempts_for(ErrorClass.STORAGE_5XX) == 2


@pytest.mark.parametrize(
    "retry",
    [
        {"attempts": {"Relevo.Transient.NetworkTimeout": 6}},
        {"attempts": {"Relevo.Transient.NetworkTimeout": 0}},
        {"default_attempts": 6},
        {"default_attempts": 0},
        {"attempts": {"Relevo.Not.AClass": 2}},
    ],
)
def test_attempts_out_of_bounds_are_refused(retry: dict[str, Any]) -> None:
    """Given more than 5 (or fewer than 1) attempts, or an unknown class, when validated, then refused."""
    with pytest.raises(ValidationError):
        RetryPolicy.model_validate(retry)
    stages = [{"name": "build", "command": "make", "retry": retry}]
    assert refusal(minimal_envelope(stages=stages)).code is ErrorCode.VALIDATION_FAILED


def test_output_rule_pattern_that_compiles_is_accepted() -> None:
    """Given an output rule with a valid regular expression, when validated, then it is kept as is."""
    rule = OutputRule(pattern=r"(?i)connection reset", error_class=ErrorClass.CONNECTION_RESET)
    assert rule.pattern == r"(?i)connection reset"


def test_output_rule_pattern_that_does_not_compile_is_a_validation_failure() -> None:
    """Given an output rule whose pattern is not a regular expression, when validated, then it is a
    ValidationError, and read_envelope refuses it with VALIDATION_FAILED."""
    with pytest.raises(ValidationError):
        OutputRule(pattern="([unclosed", error_class=ErrorClass.NETWORK_TIMEOUT)
    rules = [{"pattern": "([unclosed", "error_class": "Relevo.Fatal.ExitCode"}]
    stages = [{"name": "build", "command": "make", "retry": {"output_rules": rules}}]
    assert refusal(minimal_envelope(stages=stages)).code is ErrorCode.VALIDATION_FAILED


# --------------------------------------------------------------------------------------------
# Job ids
# --------------------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    earlier=st.floats(min_value=0, max_value=4_000_000_000, allow_nan=False),
    later=st.floats(min_value=0, max_value=4_000_000_000, allow_nan=False),
)
def test_job_ids_sort_by_creation_time(earlier: float, later: float) -> None:
    """Given two creation times in different milliseconds, when ids are made, then the ids compare
    in the same order as the times and match the envelope's job_id pattern."""
    assume(int(earlier * 1000) < int(later * 1000))
    first, second = new_job_id(earlier), new_job_id(later)
    assert first < second
    assert len(first) == len(second) == 30
    read_envelope(minimal_envelope(job_id=first, retry_of=second))


def test_job_ids_increase_over_a_sequence_of_times() -> None:
    """Given increasing times one millisecond apart, when ids are made, then they are already sorted."""
    ids = [new_job_id(1_700_000_000 + step / 1000) for step in range(0, 2000, 7)]
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)


def test_job_ids_in_the_same_millisecond_are_distinct() -> None:
    """Given the same creation time, when many ids are made, then none repeats (random suffix)."""
    ids = {new_job_id(1_700_000_000.0) for _ in range(1000)}
    assert len(ids) == 1000


@settings(max_examples=200, deadline=None)
@given(envelope=envelopes())
def test_any_envelope_round_trips_through_the_job_record_packed(envelope: JobEnvelope) -> None:
    """Given any valid envelope, when a job record is made of it and goes through DynamoDB item
    form, then the record carries it packed (no `envelope` map) and reads back equal."""
    record = job_item(envelope, JobStatus.QUEUED, envelope.created_at)
    assert "envelope" not in record and isinstance(record["packed_envelope"], str)
    assert read_envelope(envelope_of(from_attributes(to_attributes(record)))) == envelope


def test_a_record_written_before_the_envelope_was_packed_is_read_from_its_map() -> None:
    """Given a job record written before (its envelope a map, no packed_envelope), when its
    envelope is read, then it is the map's; a record with neither reads as no envelope."""
    envelope = JobEnvelope(
        job_id=new_job_id(1_700_000_000),
        idempotency_key="k",
        project="p1",
        region_affinity="eu-west",
        artifact_uri="s3://bucket/p1/j/",
        created_at=datetime(2026, 1, 1, tzinfo=UTC),
        ttl=1_800_000_000,
        trigger=Trigger(type=TriggerType.API, source="api"),
        ref="refs/heads/main",
        stages=(StagePlan(name="build", command="true"),),
    )
    old = from_attributes(to_attributes({"pk": "JOB#j", "sk": "JOB", "envelope": envelope.to_json_dict()}))
    assert read_envelope(envelope_of(old)) == envelope
    assert envelope_of({"pk": "JOB#j", "sk": "JOB"}) == {}
