"""Plan limits: each is refused with PLAN_TOO_LARGE (422) naming the limit and the size, a plan at
each limit is accepted, and the arithmetic in relevo_core.plan_limits holds for the worst case."""

from __future__ import annotations

import json
from typing import Any

import pytest

from relevo_core import plan_limits
from relevo_core.execution import execution_input
from relevo_core.models.errors import ErrorCode, RelevoError
from relevo_core.models.project import Project
from relevo_core.plan_limits import (
    MAX_COMMAND_BYTES,
    MAX_ENVELOPE_BYTES,
    MAX_FAILURE_CAUSE_CHARS,
    MAX_PROBE_BYTES,
    MAX_STAGES,
    STATE_PAYLOAD_QUOTA_BYTES,
    envelope_bytes,
    largest_envelope,
    require_project_fits,
    state_bytes,
)
from relevo_core.store.codec import pack_envelope, to_attribute

KIB = 1024
# Step Functions' limit on a task failure's error name (TaskFailedEventDetails).
MAX_ERROR_CHARS = 256
# The margin plan_limits states for the worst case.
STATED_MARGIN_BYTES = 40 * KIB


def stage_names(count: int) -> list[str]:
    return [f"s{index:02d}" + "x" * 60 for index in range(count)]


# A declaration whose every field other than the stages is at its longest.
LONGEST = {
    "id": "p" * 63,
    "repo": "acme/app",
    "region_affinity": "r" * 32,
    "queue_timeout_sec": 86_400,
    "lease_ttl_sec": 3600,
    "retry": {"default_attempts": 5, "backoff_base_sec": 600, "max_delay_sec": 3600},
}


def project(stages: list[dict[str, Any]], declaration: dict[str, Any] = LONGEST) -> Project:
    return Project.model_validate({**declaration, "stages": stages})


def largest_allowed_stages(declaration: dict[str, Any] = LONGEST) -> list[dict[str, Any]]:
    """32 stages with the longest names, the first with a command and a probe at their limits and
    the second with a command at its limit, the last command as long as the envelope limit
    allows for this declaration: exactly MAX_ENVELOPE_BYTES."""
    names = stage_names(MAX_STAGES)
    stages: list[dict[str, Any]] = [{"name": name, "run": "x"} for name in names]
    stages[0] = {"name": names[0], "run": "c" * MAX_COMMAND_BYTES, "effect_probe": "p" * MAX_PROBE_BYTES}
    stages[1] = {"name": names[1], "run": "c" * MAX_COMMAND_BYTES}
    short = envelope_bytes(largest_envelope(project(stages, declaration)))
    stages[-1]["run"] = "x" * (1 + MAX_ENVELOPE_BYTES - short)
    assert len(stages[-1]["run"]) <= MAX_COMMAND_BYTES
    assert envelope_bytes(largest_envelope(project(stages, declaration))) == MAX_ENVELOPE_BYTES
    return stages


def refusal(stages: list[dict[str, Any]]) -> RelevoError:
    with pytest.raises(RelevoError) as refused:
        require_project_fits(project(stages))
    assert (refused.value.code, refused.value.status) == (ErrorCode.PLAN_TOO_LARGE, 422)
    return refused.value


def test_a_plan_at_every_limit_is_accepted():
    require_project_fits(project(largest_allowed_stages()))


@pytest.mark.parametrize(
    ("grow", "limit", "size", "allowed"),
    [
        (lambda stages: stages + [{"name": "extra", "run": "true"}], "stages", MAX_STAGES + 1, MAX_STAGES),
        (
            lambda stages: [{**stages[0], "run": "c" * (MAX_COMMAND_BYTES + 1)}] + stages[1:],
            "command_bytes",
            MAX_COMMAND_BYTES + 1,
            MAX_COMMAND_BYTES,
        ),
        (
            lambda stages: [{**stages[0], "effect_probe": "é" * (MAX_PROBE_BYTES // 2) + "p"}] + stages[1:],
            "effect_probe_bytes",
            MAX_PROBE_BYTES + 1,
            MAX_PROBE_BYTES,
        ),
        (
            lambda stages: stages[:-1] + [{**stages[-1], "run": stages[-1]["run"] + "x"}],
            "envelope_bytes",
            MAX_ENVELOPE_BYTES + 1,
            MAX_ENVELOPE_BYTES,
        ),
    ],
    ids=["stages", "command", "probe (bytes, not characters)", "envelope"],
)
def test_one_over_a_limit_is_refused_naming_the_limit_and_the_size(grow, limit, size, allowed):
    refused = refusal(grow(largest_allowed_stages()))

    assert refused.details == {"limit": limit, "size": size, "allowed": allowed}
    assert f"{size:,}" in refused.message and f"{allowed:,}" in refused.message


def test_the_dead_letter_path_of_the_largest_plan_fits_with_the_stated_margin():
    """The state the dead-letter path holds for the largest plan (plan_limits' arithmetic), built
    as the state machine builds it: the execution input, the job record read back (DynamoDB JSON),
    the failure with the longest cause Relevo sends, made of a character JSON escapes, what
    waiting and waking add. The emulator check of the same is tests/integration/test_plan_limits.py."""
    envelope = largest_envelope(project(largest_allowed_stages()))
    job_input = execution_input(envelope, "https://sqs.eu-west-1.amazonaws.com/123456789012/" + "q" * 80)
    rest = {name: value for name, value in job_input.items() if name != "envelope"}
    assert state_bytes(rest) <= 16 * KIB
    detail = {
        "stage": envelope.stages[0].name,
        "stage_index": 0,
        "error_class": "E" * MAX_ERROR_CHARS,
        "cause": "\u0001" * MAX_FAILURE_CAUSE_CHARS,
        "attempts": 5,
        "retry_count": 4,
        "cumulative_backoff_sec": 14_400,
    }
    token = "t" * 2048  # SendTaskSuccess: a task token of at most 2,048 characters
    state = {
        **job_input,
        "conflict": {"retries": 0},
        "waiting": {"since": "2026-01-01T00:00:00.000Z"},
        "peek": {"Item": {"count": {"N": "1"}, "wake_seq": {"N": "99999999"}}},
        "queue": {"count": 1, "items": [{"job_id": {"S": envelope.job_id}}]},
        "lock": {"held": False},
        # DescribeStageFailure's States.JsonToString: compact JSON.
        "error": {"Error": "E" * MAX_ERROR_CHARS, "Cause": json.dumps(detail, separators=(",", ":"))},
        "dead": {
            "record": {
                "status": to_attribute("failed"),
                "last_successful_stage": to_attribute(envelope.stages[-2].name),
                "envelope": to_attribute(envelope.to_json_dict()),
            }
        },
        "wake": {
            "count": 1,
            "items": [{"job_id": {"S": envelope.job_id}}],
            "head": {"Item": {"wake_token": {"S": token}}},
        },
    }

    assert state_bytes(state) <= STATE_PAYLOAD_QUOTA_BYTES - STATED_MARGIN_BYTES


def test_an_envelope_zlib_cannot_shrink_is_counted_by_its_packed_form_the_job_record_carries():
    """The job record holds the envelope packed (zlib, base64): base64 adds a third to what zlib
    cannot shrink, so for random tokens the packed form is the larger one, and the limit counts it."""
    import random

    rng = random.Random(7)
    alphabet = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) not in '\\"')

    def noise(length: int) -> str:
        return "".join(rng.choice(alphabet) for _ in range(length))

    stages = [{"name": name, "run": "x"} for name in stage_names(5)]
    for stage in stages[:4]:
        stage["run"] = noise(MAX_COMMAND_BYTES)
    short = state_bytes(to_attribute(largest_envelope(project(stages)).to_json_dict()))
    # Given: a last command that takes the envelope's DynamoDB JSON to exactly the limit.
    stages[4]["run"] = "x" + noise(MAX_ENVELOPE_BYTES - short)
    envelope = largest_envelope(project(stages))
    data = envelope.to_json_dict()
    assert state_bytes(to_attribute(data)) == MAX_ENVELOPE_BYTES

    # Then its packed form, what the dead-letter path reads back, is larger, and is what counts.
    packed = state_bytes({"S": pack_envelope(data)})
    assert packed > MAX_ENVELOPE_BYTES
    assert envelope_bytes(envelope) == packed
    with pytest.raises(RelevoError) as refused:
        plan_limits.require_envelope_fits(envelope)
    assert refused.value.code is ErrorCode.PLAN_TOO_LARGE


def test_limits_count_what_the_emulator_counts():
    """ASCII escapes and the default separators, as moto's interpreter measures a state: never less
    than compact UTF-8, which AWS counts."""
    value = {"a": 'é\u0001"', "b": [1, 2]}
    assert (
        state_bytes(value)
        == len(json.dumps(value))
        >= len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())
    )
    assert plan_limits.STATE_PAYLOAD_QUOTA_BYTES == 262_144


def largest_fan_out(stages: list[dict[str, Any]], shards: int) -> list[dict[str, Any]]:
    """The largest plan, its second stage run as `shards` shards (a matrix of one key)."""
    fanned = [dict(stage) for stage in stages]
    fanned[1]["matrix"] = {"k" * 32: [f"{index:02d}" + "v" * 62 for index in range(shards)]}
    fanned[1]["fail_fast"] = False
    fanned[1]["max_parallel"] = shards
    return fanned


def test_the_largest_fan_out_the_history_allows_is_accepted_and_its_arithmetic_holds():
    """32 stages, one of them with the most shards the history arithmetic leaves (45 runs in
    all): accepted, its worst case inside 80 % of the quota, one shard more over it."""
    shards = plan_limits.MAX_SHARD_RUNS - (MAX_STAGES - 1)
    stages = largest_fan_out([{"name": name, "run": "x"} for name in stage_names(MAX_STAGES)], shards)

    require_project_fits(project(stages))
    worst = (
        plan_limits.MAX_SHARD_RUNS * plan_limits.EVENTS_PER_STAGE_RUN_WORST
        + plan_limits.LOCK_WAIT_EVENTS
        + plan_limits.JOB_EVENTS
    )
    assert worst <= 0.8 * plan_limits.HISTORY_QUOTA_EVENTS
    assert worst + plan_limits.EVENTS_PER_STAGE_RUN_WORST > 0.8 * plan_limits.HISTORY_QUOTA_EVENTS


def test_one_shard_over_the_history_arithmetic_is_refused_with_the_arithmetic_in_one_line():
    shards = plan_limits.MAX_SHARD_RUNS - (MAX_STAGES - 1) + 1
    stages = largest_fan_out([{"name": name, "run": "x"} for name in stage_names(MAX_STAGES)], shards)

    refused = refusal(stages)

    assert refused.details == {"limit": "shard_runs", "size": 46, "allowed": 45}
    assert "\n" not in refused.message
    assert refused.message.startswith(
        f"stages: 46 stage runs ({stage_names(MAX_STAGES)[1]}: {shards}; 1 for each other stage); at most "
        "45: "
    )
    assert (
        "45 × 240 events at worst + 9,000 waiting for the project + 200 of the job fit 80% of Step "
        "Functions' 25,000-event" in refused.message
    )


def test_a_parallel_stage_counts_its_shards_too():
    refused = refusal(
        [{"name": "build", "run": "x"}, {"name": "test", "run": "x", "parallel": plan_limits.MAX_SHARD_RUNS}]
    )

    assert refused.details == {"limit": "shard_runs", "size": 46, "allowed": 45}
    require_project_fits(
        project(
            [{"name": "build", "run": "x"}, {"name": "test", "run": "x", "parallel": 44, "max_parallel": 40}]
        )
    )


def test_the_dead_letter_path_of_the_largest_fan_out_fits_with_the_stated_margin():
    """The largest plan with its largest fan-out: the envelope at its limit (the matrix counted
    in it), the execution input's rest inside its line, the dead-letter state with the margin."""
    shards = plan_limits.MAX_SHARD_RUNS - (MAX_STAGES - 1)
    stages = largest_fan_out(largest_allowed_stages(), shards)
    short = envelope_bytes(largest_envelope(project(stages)))
    stages[-1]["run"] = stages[-1]["run"][: len(stages[-1]["run"]) - (short - MAX_ENVELOPE_BYTES)]
    require_project_fits(project(stages))
    envelope = largest_envelope(project(stages))
    assert envelope_bytes(envelope) == MAX_ENVELOPE_BYTES

    job_input = execution_input(envelope, "https://sqs.eu-west-1.amazonaws.com/123456789012/" + "q" * 80)
    rest = {name: value for name, value in job_input.items() if name != "envelope"}
    assert state_bytes(rest) <= 20 * KIB
    detail = {
        "stage": envelope.stages[1].name,
        "stage_index": 1,
        "shard": shards - 1,
        "error_class": "E" * MAX_ERROR_CHARS,
        "cause": "\u0001" * MAX_FAILURE_CAUSE_CHARS,
        "attempts": 5,
        "retry_count": 4,
        "cumulative_backoff_sec": 14_400,
    }
    state = {
        **job_input,
        "error": {"Error": "E" * MAX_ERROR_CHARS, "Cause": json.dumps(detail, separators=(",", ":"))},
        "dead": {"record": {"envelope": to_attribute(envelope.to_json_dict())}},
    }
    assert state_bytes(state) <= STATE_PAYLOAD_QUOTA_BYTES - STATED_MARGIN_BYTES


def test_pause_holds_at_the_largest_fan_out_renew_as_one_stage_does_and_fit_the_free_fifth_of_the_history():
    """Issue 32: a pause holding the most shards one stage may have. Each shard's renewed wait
    lasts an hour per shard that may wait beside it (relevo_core.execution.shard_pause_hold_sec),
    so over the longest pause (7 days) the shards renew no more than one stage would, plus one
    first renewal each; the total fits the fifth of the history quota the stage runs leave free.
    The wait stays under the work queue's message retention, so a resumed agent still finds the
    message (template.yaml: MessageRetentionPeriod)."""
    from relevo_core.execution import PAUSE_HOLD_SEC, shard_pause_hold_sec
    from relevo_core.models.requests import PAUSE_MAX_SEC

    shards = plan_limits.MAX_SHARD_RUNS - (MAX_STAGES - 1)
    stages = largest_fan_out([{"name": name, "run": "x"} for name in stage_names(MAX_STAGES)], shards)
    envelope = largest_envelope(project(stages))
    fanned = execution_input(envelope, "https://sqs.eu-west-1.amazonaws.com/123456789012/q")["stages"][1][
        "shards"
    ]
    assert fanned["pause_hold_sec"] == shards * PAUSE_HOLD_SEC == 14 * 3600

    def renewals(waiting: int, hold_sec: int) -> int:
        """`waiting` dispatches renewed side by side through a whole pause, each every hold_sec
        from its first renewal (the one its queue timeout met)."""
        return waiting * (PAUSE_MAX_SEC // hold_sec + 1)

    for count in range(1, plan_limits.MAX_SHARD_RUNS + 1):
        for max_parallel in {None, 1, max(1, count // 2), count}:
            waiting = min(count, max_parallel or count)
            assert (
                renewals(waiting, shard_pause_hold_sec(count, max_parallel))
                <= PAUSE_MAX_SEC // PAUSE_HOLD_SEC + waiting
            )
    assert renewals(1, PAUSE_HOLD_SEC) == 169  # a stage without shards, as before
    # The largest fan-out: 45 shards, each renewed every 45 h, against 45 × 169 were each renewed hourly.
    largest = shard_pause_hold_sec(plan_limits.MAX_SHARD_RUNS, None)
    assert (largest, renewals(plan_limits.MAX_SHARD_RUNS, largest)) == (45 * 3600, 180)
    assert (
        plan_limits.MAX_SHARD_RUNS * renewals(1, PAUSE_HOLD_SEC) * plan_limits.EVENTS_PER_PAUSE_RENEWAL
        > plan_limits.HISTORY_QUOTA_EVENTS
    )
    assert (plan_limits.PAUSE_HOLD_RENEWALS_WORST, plan_limits.PAUSE_HOLD_EVENTS_WORST) == (213, 4686)
    assert (
        plan_limits.PAUSE_HOLD_EVENTS_WORST
        <= plan_limits.HISTORY_FREE_FRACTION * plan_limits.HISTORY_QUOTA_EVENTS
    )

    assert largest < _work_queue_retention_sec() == 4 * 24 * 3600


def _work_queue_retention_sec() -> int:
    """The regions' work queues' MessageRetentionPeriod in template.yaml."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "template.yaml").read_text(encoding="utf-8")
    work_queue = text[text.index("WorkQueue&{Region}:") : text.index("WorkDeadLetterQueue&{Region}:")]
    return int(re.search(r"MessageRetentionPeriod: (\d+)", work_queue).group(1))


# Step Functions Developer Guide, "Using Map state in Inline mode": "In this mode, the Map state
# supports up to 40 concurrent iterations." A stage's shards are an inline Map's iterations
# (job.asl.json: RunShards); the emulator runs as many as it is given, so the bound is checked here.
INLINE_MAP_CONCURRENCY = 40


@pytest.mark.parametrize(
    ("fan_out", "size", "says"),
    [
        ({"parallel": 41}, 41, "41 shards and no max_parallel, which would run them all at once"),
        ({"parallel": 44, "max_parallel": 41}, 41, "max_parallel 41 (of 44 shards)"),
        (
            {"matrix": {"device": [f"d{index}" for index in range(11)], "os": ["17", "18", "26", "27"]}},
            44,
            "44 shards and no max_parallel, which would run them all at once",
        ),
    ],
    ids=["parallel past 40, no max_parallel", "max_parallel past 40", "a matrix of 44, no max_parallel"],
)
def test_a_stage_asking_more_than_40_shards_at_once_is_refused_saying_how_it_could_run(fan_out, size, says):
    # Given: a stage whose shards would run more than an inline Map runs at once
    # When: the plan is checked (relevo project apply)
    refused = refusal([{"name": "build", "run": "x"}, {"name": "test", "run": "x", **fan_out}])

    # Then: PLAN_TOO_LARGE naming the limit, the stage and both ways that fit
    assert refused.details == {"limit": "concurrent_shards", "size": size, "allowed": INLINE_MAP_CONCURRENCY}
    assert refused.message.startswith(f"stages.1 (test): {says}; ")
    assert "at most 40 of a stage's shards run at once" in refused.message
    assert "set max_parallel to 40 or less" in refused.message and "split the stage" in refused.message
    assert "\n" not in refused.message


def test_a_stage_of_up_to_40_shards_runs_them_all_at_once_and_more_run_40_at_a_time_with_max_parallel():
    # Given / When / Then: 40 shards without max_parallel, and the largest fan-out 40 at a time, are accepted
    assert plan_limits.MAX_CONCURRENT_SHARDS == INLINE_MAP_CONCURRENCY
    require_project_fits(
        project([{"name": "build", "run": "x"}, {"name": "test", "run": "x", "parallel": 40}])
    )
    require_project_fits(
        project([{"name": "test", "run": "x", "parallel": plan_limits.MAX_SHARD_RUNS, "max_parallel": 40}])
    )
    # A max_parallel over the stage's shards asks no more than its shards at once.
    require_project_fits(project([{"name": "test", "run": "x", "parallel": 4, "max_parallel": 256}]))
