"""Two shards of one stage on one Mac never share a workspace (relevo_agent.admission): a shard
takes the first of its project's workspaces no other stage occupies, of this agent process or of
another one sharing the workspace root; a stage without shards keeps its project's."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

from relevo_agent.admission import Admission
from relevo_agent.config import AgentConfig
from relevo_agent.journal import Journal
from relevo_agent.messages import Message
from relevo_core.models.stage_message import StageMessage


def _admission(tmp_path: Path, agent_id: str = "mac-1") -> Admission:
    config = AgentConfig(
        agent_id=agent_id,
        region="eu",
        capacity=4,
        workspace_root=tmp_path / "ws",
        journal=tmp_path / f"{agent_id}.sqlite3",
    )
    return Admission(config, Journal(config.journal))


def _task(shard: int | None, project: str = "app") -> StageMessage:
    return StageMessage(
        job_id="job_" + "a" * 20,
        stage="test",
        stage_index=0,
        shard=shard,
        attempt=1,
        task_token="t",
        dispatch_key="k",
        project=project,
        lease_ttl_sec=60,
    )


# Admission touches the message only to send it back, which these cases never do.
_MESSAGE = Message("http://queue", {"Body": "{}", "ReceiptHandle": "r"})


def _admit(admission: Admission, stack: ExitStack, shard: int | None, project: str = "app") -> Path:
    reservation = stack.enter_context(
        admission.admitted(_task(shard, project), _MESSAGE, f"op-{project}-{shard}")
    )
    assert reservation is not None
    return reservation.workspace


def test_two_shards_on_one_agent_run_in_two_workspaces_and_a_freed_one_is_taken_again(tmp_path: Path):
    admission = _admission(tmp_path)
    root = tmp_path / "ws"
    with ExitStack() as first:
        assert _admit(admission, first, 0) == root / "app"
        with ExitStack() as second:
            assert _admit(admission, second, 1) == root / "app.2"
            with ExitStack() as third:
                assert _admit(admission, third, 2) == root / "app.3"
                assert admission.workspaces_in_use() == {root / "app", root / "app.2", root / "app.3"}
        # Shards 1 and 2 ended: the next shard takes the first free workspace again.
        with ExitStack() as fourth:
            assert _admit(admission, fourth, 3) == root / "app.2"
    with ExitStack() as alone:
        assert _admit(admission, alone, 1) == root / "app"


def test_a_shard_of_another_agent_process_sharing_the_workspace_root_is_not_joined(tmp_path: Path):
    # Two agent processes of one Mac with the default workspace root: the occupancy is a flock,
    # which another open file of the same file cannot take either.
    this_process, other_process = _admission(tmp_path, "mac-1"), _admission(tmp_path, "mac-1b")
    root = tmp_path / "ws"
    with ExitStack() as running:
        assert _admit(other_process, running, 0) == root / "app"
        assert _admit(this_process, running, 1) == root / "app.2"
        assert _admit(this_process, running, 2) == root / "app.3"


def test_a_stage_without_shards_keeps_its_projects_workspace_and_other_projects_are_apart(tmp_path: Path):
    admission = _admission(tmp_path)
    root = tmp_path / "ws"
    with ExitStack() as running:
        assert _admit(admission, running, None, "app") == root / "app"
        assert _admit(admission, running, None, "lib") == root / "lib"
        assert _admit(admission, running, 0, "lib2") == root / "lib2"
