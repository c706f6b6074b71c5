"""What a later stage stands on when an earlier stage ran as shards (relevo_core.jobs.handoff_sources
and relevo_agent.prepare, no AWS): each succeeded shard an earlier stage of its own, in shard
order, read from its own record; nothing of a stage with shards until the stage as a whole
succeeded; a shard whose success was decided without its handoff failing the later stage, named."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from relevo_agent.prepare import PrepareFailure, require_handoffs
from relevo_core.jobs.handoff_sources import JobContext, earlier_stages
from relevo_core.models.envelope import JobEnvelope, Trigger, TriggerType
from relevo_core.models.errors import ErrorClass, ErrorCode, RelevoError
from relevo_core.models.project import Project
from relevo_core.store import keys

JOB = "job_" + "0" * 24
SHA = "a" * 64


def _envelope() -> JobEnvelope:
    project = Project.model_validate(
        {
            "id": "app",
            "repo": "acme/app",
            "region_affinity": "eu-west",
            "stages": [
                {"name": "build", "run": "make", "handoff": ["build/"]},
                {"name": "test", "run": "make test", "parallel": 3, "handoff": ["results/"]},
                {"name": "report", "run": "true"},
            ],
        }
    )
    return JobEnvelope(
        job_id=JOB,
        idempotency_key="k",
        project="app",
        region_affinity="eu-west",
        artifact_uri="s3://bucket/app/",
        created_at=datetime.now(UTC),
        ttl=1,
        trigger=Trigger(type=TriggerType.API, source="api"),
        ref="main",
        stages=project.frozen_stages(),
    )


def _handoff(name: str) -> dict[str, Any]:
    return {
        "manifest": f"s3://bucket/app/.relevo-handoff/manifests/{name}.1.json",
        "manifest_sha256": SHA,
        "attempt": 1,
        "digest": SHA,
        "stored_at": "2026-12-03T00:00:00+00:00",
    }


def _record(
    sk: str,
    name: str,
    status: str = "succeeded",
    shard: int | None = None,
    handoff: bool = True,
    **outputs: str,
) -> dict[str, Any]:
    receipt: dict[str, Any] = {"outputs": outputs}
    if handoff:
        receipt["handoff"] = _handoff(name if shard is None else f"{name}.shard-{shard}")
    record = {
        "pk": f"STAGES#{JOB}",
        "sk": sk,
        "stage_name": name,
        "status": status,
        "agent_id": f"mac-{shard}",
        "receipt": receipt,
    }
    return record if shard is None else {**record, "shard_index": shard}


def _items(test_status: str = "succeeded", **shard_changes: dict[str, Any]) -> list[dict[str, Any]]:
    shards = [
        _record(keys.shard_sk(1, k), "test", shard=k, passed=str(k), **shard_changes.get(str(k), {}))
        for k in (2, 0, 1)
    ]
    return [
        _record(keys.stage_sk(0), "build", version="1"),
        {**_record(keys.stage_sk(1), "test", handoff=False), "status": test_status},
        *shards,
    ]


def test_each_succeeded_shard_is_an_earlier_stage_of_its_own_in_shard_order():
    envelope = _envelope()
    earlier = earlier_stages("table", JobContext.of(envelope, _items()), 2)

    assert [(stage.label, stage.outputs) for stage in earlier] == [
        ("build", {"version": "1"}),
        ("test#shard-0", {"passed": "0"}),
        ("test#shard-1", {"passed": "1"}),
        ("test#shard-2", {"passed": "2"}),
    ]
    assert [stage.handoff.manifest.rsplit("/", 1)[1] for stage in earlier if stage.handoff] == [
        "build.1.json",
        "test.shard-0.1.json",
        "test.shard-1.1.json",
        "test.shard-2.1.json",
    ]
    require_handoffs(envelope, earlier, 2)


def test_a_stage_with_shards_hands_nothing_on_until_it_succeeded_as_a_whole():
    earlier = earlier_stages("table", JobContext.of(_envelope(), _items(test_status="running")), 2)

    assert [stage.label for stage in earlier] == ["build"]


@pytest.mark.parametrize(
    ("changes", "error", "says"),
    [
        (
            {"1": {"handoff": False}},
            ErrorClass.HANDOFF_MISSING,
            f"stage test#shard-1 of {JOB} declares handoff results/ but handed nothing on",
        ),
        (
            {"1": {"status": "failed"}},
            ErrorClass.HANDOFF_GONE,
            "stage test (shard 1) hands files on, but no succeeded run of it is on record",
        ),
    ],
    ids=["resolved without its handoff", "no succeeded run"],
)
def test_a_shard_without_its_handoff_fails_the_later_stage_naming_it(changes, error: ErrorClass, says: str):
    envelope = _envelope()
    earlier = earlier_stages("table", JobContext.of(envelope, _items(**changes)), 2)

    with pytest.raises(PrepareFailure) as refused:
        require_handoffs(envelope, earlier, 2)
    assert refused.value.error_class is error
    assert says in refused.value.message


def _first_checkout_sharded(*commits: str | None) -> JobContext:
    """A job from a ref only whose first stage (test, with shards) checked out: each shard's
    resolved commit on its own record (None: that shard recorded none)."""
    project = Project.model_validate(
        {
            "id": "app",
            "repo": "acme/app",
            "region_affinity": "eu-west",
            "checkout": {"url": "https://git.example/app.git"},
            "stages": [
                {"name": "test", "run": "make test", "parallel": len(commits)},
                {"name": "report", "run": "true"},
            ],
        }
    )
    envelope = JobEnvelope(
        job_id=JOB,
        idempotency_key="k",
        project="app",
        region_affinity="eu-west",
        artifact_uri="s3://bucket/app/",
        created_at=datetime.now(UTC),
        ttl=1,
        trigger=Trigger(type=TriggerType.API, source="api"),
        ref="main",
        stages=project.frozen_stages(),
        checkout=project.checkout,
    )
    shards = [
        {
            **_record(keys.shard_sk(0, k), "test", shard=k, handoff=False),
            **({"checkout_commit": commit} if commit else {}),
        }
        for k, commit in enumerate(commits)
    ]
    return JobContext.of(envelope, [{**_record(keys.stage_sk(0), "test", handoff=False)}, *shards])


def test_the_commit_a_stage_with_shards_checked_out_first_is_the_jobs():
    assert _first_checkout_sharded("c" * 40, "c" * 40, None).commit() == "c" * 40


def test_shards_that_checked_out_different_commits_leave_the_job_none_and_say_which():
    context = _first_checkout_sharded("c" * 40, "d" * 40, "c" * 40)

    with pytest.raises(RelevoError) as differ:
        context.commit()
    assert differ.value.code is ErrorCode.COMMITS_DIFFER and differ.value.status == 409
    assert f"shard 0 {'c' * 40}, shard 1 {'d' * 40}, shard 2 {'c' * 40}" in differ.value.message
    assert differ.value.details == {"stage": "test", "commits": {"0": "c" * 40, "1": "d" * 40, "2": "c" * 40}}
