"""What an agent detects (relevo_agent.capabilities) from the outputs of `sw_vers`,
`xcode-select -p`, `xcodebuild -version` and `xcrun --show-sdk-version` (fixtures/capabilities:
the formats these commands print on macOS 15 with Xcode 16.2), and how a stage's `requires`
match it."""

from __future__ import annotations

import plistlib
from datetime import UTC
from pathlib import Path

import pytest

from relevo_agent.capabilities import detect
from relevo_core.models.capabilities import Capabilities, describe, unmet
from relevo_core.models.plan import StagePlan
from relevo_core.models.project_stage import ProjectStage

RECORDED = Path(__file__).parent / "fixtures" / "capabilities"


def _recorded(outputs: dict[tuple[str, ...], str | None]):
    calls = []

    def run(argv: list[str]) -> str | None:
        calls.append(tuple(argv))
        return outputs.get(tuple(argv))

    return run, calls


def _mac_outputs() -> dict[tuple[str, ...], str | None]:
    return {
        ("sw_vers", "-productVersion"): (RECORDED / "sw_vers-productVersion.txt").read_text(),
        ("xcode-select", "-p"): (RECORDED / "xcode-select-p.txt").read_text(),
        ("xcodebuild", "-version"): (RECORDED / "xcodebuild-version.txt").read_text(),
        ("xcrun", "--show-sdk-version"): (RECORDED / "xcrun-show-sdk-version.txt").read_text(),
    }


def _applications(tmp_path: Path, *versions: str) -> Path:
    for version in versions:
        contents = tmp_path / f"Xcode-{version}.app" / "Contents"
        contents.mkdir(parents=True)
        (contents / "version.plist").write_bytes(plistlib.dumps({"CFBundleShortVersionString": version}))
    (tmp_path / "Safari.app").mkdir()
    return tmp_path


def test_a_mac_reports_macos_the_selected_xcode_every_xcode_arch_and_disk(tmp_path: Path):
    run, calls = _recorded(_mac_outputs())
    found = detect(
        tmp_path,
        {"signing": "enterprise"},
        run=run,
        system="Darwin",
        machine="arm64",
        applications=_applications(tmp_path / "Applications", "15.4", "16.2"),
        disk=lambda _: 412.5,
    )
    assert found == Capabilities(
        os="darwin",
        arch="arm64",
        macos="15.2",
        xcode="16.2",
        # The build number and the SDK: what a cache key names (an Xcode upgrade is another key).
        xcode_build="16C5032a",
        sdk="15.2",
        xcode_path="/Applications/Xcode-16.2.app/Contents/Developer",
        xcode_versions=("15.4", "16.2"),
        free_disk_gb=412.5,
        labels={"signing": "enterprise"},
    )
    assert calls == [
        ("sw_vers", "-productVersion"),
        ("xcode-select", "-p"),
        ("xcodebuild", "-version"),
        ("xcrun", "--show-sdk-version"),
    ]


def test_a_mac_without_a_selected_xcode_has_none(tmp_path: Path):
    # xcode-select -p fails (exit 2, the stderr in fixtures): xcodebuild is not asked.
    run, calls = _recorded({("sw_vers", "-productVersion"): "14.6\n"})
    found = detect(
        tmp_path,
        {},
        run=run,
        system="Darwin",
        machine="x86_64",
        applications=tmp_path / "none",
        disk=lambda _: 20.0,
    )
    assert (found.macos, found.xcode, found.xcode_path, found.arch) == ("14.6", None, None, "x86_64")
    assert ("xcodebuild", "-version") not in calls


def test_linux_reports_what_it_can(tmp_path: Path):
    found = detect(
        tmp_path,
        {"xcode": "16.2", "pool": "ci"},
        system="Linux",
        machine="aarch64",
        applications=tmp_path / "none",
    )
    # Nothing of macOS is there to run (the real commands, absent here); the disk is measured.
    assert (found.os, found.arch, found.macos, found.xcode) == ("linux", "arm64", None, None)
    assert found.free_disk_gb is not None and found.free_disk_gb > 0
    # A label names what was not detected; here, that includes xcode.
    assert found.facts() == {"os": "linux", "arch": "arm64", "xcode": "16.2", "pool": "ci"}


def test_a_label_never_overrides_a_detected_fact():
    mac = Capabilities(os="darwin", arch="arm64", xcode="15.4", labels={"xcode": "16.2"})
    assert mac.facts()["xcode"] == "15.4"


@pytest.mark.parametrize(
    "requires, missing",
    [
        ({"xcode": "16.*", "arch": "arm64"}, {}),
        ({"xcode": "16.2"}, {}),
        ({"xcode": "15.*"}, {"xcode": "16.2"}),
        ({"arch": "x86_64"}, {"arch": "arm64"}),
        ({"macos": "15.*", "pool": "release"}, {"pool": None}),
        ({"signing": "enterprise"}, {}),
    ],
)
def test_requirements_match_globs(requires, missing):
    mac = Capabilities(
        os="darwin", arch="arm64", macos="15.2", xcode="16.2", labels={"signing": "enterprise"}
    )
    assert unmet(requires, mac) == missing


def test_an_agent_that_reported_nothing_meets_no_requirement():
    assert unmet({"arch": "arm64"}, None) == {"arch": None}
    assert describe({"xcode": "16.*", "arch": "arm64"}) == "arch: arm64, xcode: 16.*"


def test_requires_is_validated_and_frozen_into_the_plan():
    stage = ProjectStage(name="build", run="make", requires={"xcode": "16.*", "arch": "arm64"})
    assert StagePlan(name="build", command="make", requires=stage.requires).requires == {
        "xcode": "16.*",
        "arch": "arm64",
    }
    with pytest.raises(ValueError):
        ProjectStage(name="build", run="make", requires={"Xcode Version": "16"})
    with pytest.raises(ValueError):
        ProjectStage(name="build", run="make", requires={"xcode": ""})


def test_no_matching_agent_names_the_requirement_and_the_nearest_agents():
    from datetime import datetime

    from relevo_core.jobs.view import agent_queue_reason, no_match_detail
    from relevo_core.models.status import QueueReason
    from relevo_core.store.agents import AgentPresence

    now = datetime(2026, 12, 1, tzinfo=UTC)

    def agent(agent_id: str, **facts) -> AgentPresence:
        return AgentPresence(
            agent_id=agent_id,
            region="eu",
            capacity=1,
            running=0,
            version="1",
            last_seen=now,
            interval_sec=30,
            capabilities=Capabilities(**{"os": "darwin", "arch": "arm64", **facts}),
        )

    fleet = [
        agent("mac-old", xcode="15.4"),
        agent("mac-intel", xcode="15.4", arch="x86_64"),
        agent("linux-1", os="linux"),
    ]
    requires = {"xcode": "16.*", "arch": "arm64"}
    assert agent_queue_reason(fleet, now, {}, requires) is QueueReason.NO_MATCHING_AGENT
    assert no_match_detail(requires, fleet, now) == (
        "no online agent meets requires {arch: arm64, xcode: 16.*}; nearest: "
        "linux-1 has xcode none; mac-old has xcode 15.4; mac-intel has xcode 15.4, arch x86_64"
    )
    assert agent_queue_reason([*fleet, agent("mac-new", xcode="16.1")], now, {}, requires) is None
