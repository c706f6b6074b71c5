"""Disk hygiene on the agent (issue 20): below min_free_disk_gb it claims nothing and says
agent_low_disk in its presence (the free-disk probe injected); workspace retention keeps the
`keep_workspaces` used last and never removes one a lease holds (a running stage of this process,
or an attempt the journal still has in flight); a project's cleanup runs between stages, once."""

from __future__ import annotations

from pathlib import Path

from relevo_agent.config import AgentConfig
from relevo_agent.hygiene import Hygiene
from relevo_agent.journal import Journal, Operation, OperationOutcome
from relevo_agent.presence import Presence
from relevo_agent.stop import AgentStop


def _config(tmp_path: Path, **settings) -> AgentConfig:
    return AgentConfig(
        agent_id="mac-1",
        region="eu",
        workspace_root=tmp_path / "ws",
        journal=tmp_path / "j.sqlite3",
        **settings,
    )


def test_below_min_free_disk_the_agent_says_agent_low_disk_and_above_it_claims_again(tmp_path: Path):
    presence = Presence(_config(tmp_path, min_free_disk_gb=20), "table", AgentStop())
    free = {"gb": 50.0}
    presence.measure_disk = lambda: free["gb"]
    presence.measure()
    assert presence.not_claiming() is None
    free["gb"] = 19.9
    presence.measure()
    assert presence.not_claiming() == "agent_low_disk"
    free["gb"] = None  # the probe failed: the last measure stands
    presence.measure()
    assert presence.not_claiming() == "agent_low_disk"
    free["gb"] = 25.0
    presence.measure()
    assert presence.not_claiming() is None


def _workspaces(config: AgentConfig, hygiene: Hygiene, *names: str) -> None:
    for name in names:  # used in this order: the last is the newest
        (config.workspace_root / name).mkdir(parents=True)
        hygiene.used(config.workspace_root / name)


def test_retention_keeps_the_last_used_and_never_a_leased_workspace(tmp_path: Path):
    config = _config(tmp_path, keep_workspaces=2)
    journal = Journal(config.journal)
    running: set[Path] = set()
    hygiene = Hygiene(config, journal, lambda: running)
    _workspaces(config, hygiene, "oldest", "old-leased-by-journal", "old-running", "recent", "newest")
    # An attempt still in flight in the journal (a restart reconciles it), and a running stage.
    journal.begin(
        Operation(
            "job_x/build", "job_x", "build", 0, 1, str(config.workspace_root / "old-leased-by-journal"), "v1"
        )
    )
    running.add(config.workspace_root / "old-running")

    removed = hygiene.prune()
    assert [path.name for path in removed] == ["oldest"]
    assert sorted(path.name for path in config.workspace_root.iterdir() if not path.name.startswith(".")) == [
        "newest",
        "old-leased-by-journal",
        "old-running",
        "recent",
    ]

    # Once the leases are gone, the next prune removes them too.
    running.clear()
    journal.record("job_x/build", 1, OperationOutcome.SUCCEEDED, 0, None)
    assert sorted(path.name for path in hygiene.prune()) == ["old-leased-by-journal", "old-running"]
    assert sorted(path.name for path in config.workspace_root.iterdir() if not path.name.startswith(".")) == [
        "newest",
        "recent",
    ]


def test_keep_workspaces_0_keeps_everything(tmp_path: Path):
    config = _config(tmp_path)
    hygiene = Hygiene(config, Journal(config.journal), set)
    _workspaces(config, hygiene, "a", "b", "c")
    hygiene.stage_ended("a", config.workspace_root / "a", None)
    hygiene.between_stages()
    assert sorted(path.name for path in config.workspace_root.iterdir() if not path.name.startswith(".")) == [
        "a",
        "b",
        "c",
    ]


def test_a_projects_cleanup_runs_once_between_stages_in_its_workspace(tmp_path: Path):
    config = _config(tmp_path, keep_workspaces=1)
    hygiene = Hygiene(config, Journal(config.journal), set)
    _workspaces(config, hygiene, "app")
    marker = tmp_path / "cleaned"
    hygiene.stage_ended("app", config.workspace_root / "app", f'pwd >> "{marker}"')
    hygiene.stage_ended("app", config.workspace_root / "app", f'pwd >> "{marker}"')  # two stages: one cleanup
    assert not marker.exists()  # nothing runs at the stage's end, only between stages
    hygiene.between_stages()
    assert marker.read_text().splitlines() == [str(config.workspace_root / "app")]
    hygiene.between_stages()
    assert marker.read_text().splitlines() == [str(config.workspace_root / "app")]


def test_retention_never_removes_a_workspace_another_agent_process_of_the_machine_uses(tmp_path: Path):
    """Two agents of one Mac share the default workspace root. This agent is idle and prunes; the
    other runs a stage in an older workspace, which this agent's own leases cannot know of: the
    stage's lock on the workspace keeps it. Once that stage ends, the next prune removes it."""
    config = _config(tmp_path, keep_workspaces=1)
    hygiene = Hygiene(config, Journal(config.journal), set)
    other = Hygiene(
        config.model_copy(update={"agent_id": "mac-2", "journal": tmp_path / "j2.sqlite3"}),
        Journal(tmp_path / "j2.sqlite3"),
        set,
    )
    _workspaces(config, hygiene, "used-by-the-other-agent", "newest")

    with other.locks.using(config.workspace_root / "used-by-the-other-agent"):
        assert hygiene.prune() == []
        assert (config.workspace_root / "used-by-the-other-agent").is_dir()

    assert [path.name for path in hygiene.prune()] == ["used-by-the-other-agent"]
    assert sorted(path.name for path in config.workspace_root.iterdir() if not path.name.startswith(".")) == [
        "newest"
    ]
