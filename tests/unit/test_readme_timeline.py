"""The lease timeline of docs/architecture.md (issue 14) is the code's: every number in its table is read back
from the constants and defaults it names."""

from __future__ import annotations

import re
from datetime import UTC
from pathlib import Path

from relevo_agent.config import AgentConfig
from relevo_core.lease_timeline import LeaseTimeline
from relevo_core.models.envelope import JobEnvelope
from relevo_core.models.plan import StagePlan
from relevo_core.models.project import Project, ProjectStage
from relevo_tools.drill.fleet import DrillTiming

README = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"


def _table() -> dict[str, tuple[float, float]]:
    text = README.read_text()
    section = text.split("## Fencing: the lease timeline", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[2].endswith(" s") and cells[3].endswith(" s"):
            rows[cells[0]] = (float(cells[2].removesuffix(" s")), float(cells[3].removesuffix(" s")))
    return rows


def _numbers(timeline: LeaseTimeline) -> dict[str, float]:
    return {
        "lease": timeline.lease_ttl_sec,
        "kill grace": timeline.kill_grace_sec,
        "allowed skew (`doctor`'s limit)": timeline.max_clock_skew_sec,
        "renew interval": timeline.renew_interval_sec,
        "fence margin": timeline.fence_margin_sec,
        "fence: SIGTERM to the group, result withheld, journaled `fenced`": timeline.fence_after_sec,
        "SIGKILL to whatever is left of the group": timeline.kill_after_sec,
        "`HeartbeatSeconds` of `AwaitResult`": timeline.heartbeat_seconds,
        "earliest claim of the next attempt": timeline.successor_claim_after_sec,
        "the successor's probe (or re-run), not before": timeline.successor_probe_after_sec,
    }


def test_the_defaults_agree_wherever_they_are_declared():
    assert JobEnvelope.model_fields["lease_ttl_sec"].default == Project.model_fields["lease_ttl_sec"].default
    assert (
        StagePlan.model_fields["kill_grace_sec"].default
        == ProjectStage.model_fields["kill_grace_sec"].default
    )


def test_the_readme_timeline_is_the_codes():
    defaults = LeaseTimeline(
        JobEnvelope.model_fields["lease_ttl_sec"].default,
        StagePlan.model_fields["kill_grace_sec"].default,
        AgentConfig.model_fields["max_clock_skew_sec"].default,
    )
    drill = DrillTiming()
    drilled = LeaseTimeline(drill.lease_ttl_sec, drill.kill_grace_sec, drill.max_clock_skew_sec)
    table = _table()

    assert set(table) == set(_numbers(defaults)), "the README's rows and the timeline's events differ"
    for event, expected in _numbers(defaults).items():
        assert table[event][0] == expected, (
            f"{event}: README says {table[event][0]} s, the defaults give {expected} s"
        )
    for event, expected in _numbers(drilled).items():
        assert table[event][1] == expected, (
            f"{event}: README says {table[event][1]} s, relevo drill uses {expected} s"
        )


def test_the_doctors_limit_is_the_allowed_skew(tmp_path: Path):
    from datetime import datetime, timedelta

    from relevo_agent.doctor import check_clock

    now = datetime(2026, 12, 1, tzinfo=UTC)
    config = AgentConfig(region="eu-west", max_clock_skew_sec=2)
    # The Date header has whole seconds: one second on top of the limit is allowed.
    assert check_clock(now, now + timedelta(seconds=3), config.max_clock_skew_sec).ok
    assert not check_clock(now, now + timedelta(seconds=3.5), config.max_clock_skew_sec).ok
    assert re.search(r"within 2s of AWS", check_clock(now, now, config.max_clock_skew_sec).words)


def test_doctor_checks_the_clock_against_the_agents_own_allowed_skew(monkeypatch, tmp_path: Path):
    from datetime import datetime, timedelta

    from relevo_agent import doctor

    server = datetime(2026, 12, 1, tzinfo=UTC)
    monkeypatch.setattr(
        doctor, "check_credentials", lambda: (doctor.Check("credentials", True, "test"), server)
    )
    config = AgentConfig(
        region="eu-west", max_clock_skew_sec=1, workspace_root=tmp_path, journal=tmp_path / "j.sqlite3"
    )
    checks = doctor.run_checks(config, None, None, now=lambda: server + timedelta(seconds=3))
    clock = next(check for check in checks if check.name == "clock")
    assert not clock.ok  # 3 s off fails an agent that fences with 1 s of skew (5 s would pass)
    assert doctor.MAX_CLOCK_SKEW_SEC == AgentConfig.model_fields["max_clock_skew_sec"].default
