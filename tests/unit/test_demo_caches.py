"""`make demo`'s cache scenario (relevo_tools.demo_caches): what it accepts as the dependency cache
restored on another Mac, and what makes it fail; and that its two stages can only ever run on two
different Macs, whichever Mac placement prefers."""

from __future__ import annotations

from typing import Any

import pytest

from relevo_cli.projects import load_project_file
from relevo_core.models.cache import CacheOutcome
from relevo_tools.demo_caches import FIRST, PROJECT, SECOND, check_restored
from relevo_tools.demo_harness import FLEET, LABELS, PROJECTS, NotHeld

KEY = "venv/venv-linux-x86_64-3f1c0a"
SAVED = CacheOutcome(
    name="venv",
    key=KEY,
    restore="miss",
    save="saved",
    digest="d" * 64,
    saved_bytes=16_000_000,
    uploaded_bytes=16_000_000,
    save_seconds=1.5,
)
RESTORED = CacheOutcome(
    name="venv",
    key=KEY,
    restore="hit",
    bytes=16_000_000,
    downloaded_bytes=16_000_000,
    restore_seconds=1.2,
    digest="d" * 64,
    save="exists",
)


def _job(stage: str, agent: str, outcome: CacheOutcome, step_seconds: str, digest: str) -> dict[str, Any]:
    return {
        "job_id": f"job_{stage}",
        "stages": [
            {
                "name": stage,
                "agent_id": agent,
                "outputs": {"step_seconds": step_seconds, "digest": digest},
                "caches": [outcome.model_dump(mode="json")],
            }
        ],
    }


def test_a_hit_on_another_mac_holds_and_says_what_relevo_job_view_says_with_the_seconds():
    # Given job 1 that missed and saved on mac-ap-1, and job 2 that hit the key on mac-ap-2
    saved = _job(FIRST, "mac-ap-1", SAVED, "3.40", "e" * 64)
    restored = _job(SECOND, "mac-ap-2", RESTORED, "0.10", "e" * 64)

    # When the scenario checks them
    evidence = check_restored(saved, restored)

    # Then it shows both jobs' cache lines as the job view prints them, and cold vs restored
    assert evidence[0] == (
        f"job 1 on mac-ap-1: deps-a cache venv: miss {KEY}; saved 15.3 MiB (15.3 MiB uploaded in 1.5s)"
    )
    assert evidence[1] == (
        f"job 2 on mac-ap-2: deps-b cache venv: hit {KEY}: 15.3 MiB in 1.2s, 15.3 MiB downloaded"
    )
    assert evidence[2].startswith("cold 3.40s (miss + pip install) vs restored 1.30s (restore 1.20s")
    assert "2.6x" in evidence[2]


@pytest.mark.parametrize(
    ("saved", "restored", "refusal"),
    [
        # job 2 back on job 1's Mac
        (
            _job(FIRST, "mac-ap-1", SAVED, "3.4", "e" * 64),
            _job(SECOND, "mac-ap-1", RESTORED, "0.1", "e" * 64),
            "both jobs ran on mac-ap-1",
        ),
        # job 2 missed (no entry found)
        (
            _job(FIRST, "mac-ap-1", SAVED, "3.4", "e" * 64),
            _job(SECOND, "mac-ap-2", SAVED, "3.4", "e" * 64),
            "not a hit",
        ),
        # job 1 found an entry already: nothing shows a save and its restore
        (
            _job(FIRST, "mac-ap-1", RESTORED, "0.1", "e" * 64),
            _job(SECOND, "mac-ap-2", RESTORED, "0.1", "e" * 64),
            "a miss, then saved, expected",
        ),
        # the cache's tree digest differs from the saved one
        (
            _job(FIRST, "mac-ap-1", SAVED, "3.4", "e" * 64),
            _job(SECOND, "mac-ap-2", RESTORED.model_copy(update={"digest": "f" * 64}), "0.1", "e" * 64),
            "is not the saved",
        ),
        # the step's own digest of .venv on job 2's disk differs
        (
            _job(FIRST, "mac-ap-1", SAVED, "3.4", "e" * 64),
            _job(SECOND, "mac-ap-2", RESTORED, "0.1", "f" * 64),
            "by each Mac's own digest",
        ),
        # a hit that downloaded nothing was not another Mac's restore
        (
            _job(FIRST, "mac-ap-1", SAVED, "3.4", "e" * 64),
            _job(SECOND, "mac-ap-2", RESTORED.model_copy(update={"downloaded_bytes": 0}), "0.1", "e" * 64),
            "downloaded nothing",
        ),
    ],
)
def test_anything_but_the_saved_tree_restored_on_another_mac_fails_the_scenario(
    saved: dict[str, Any], restored: dict[str, Any], refusal: str
):
    # When the scenario checks jobs that are not a save on one Mac and a hit on another
    with pytest.raises(NotHeld) as refused:
        check_restored(saved, restored)

    # Then it does not hold, and says why
    assert refusal in str(refused.value)


def test_the_two_stages_can_run_only_on_two_different_macs_of_the_project_s_region():
    # Given dep-cache's stages and the demo's fleet and labels
    project = load_project_file(PROJECTS / f"{PROJECT}.yaml").project
    stages = {s.name: s for s in project.stages}
    assert set(stages) == {FIRST, SECOND}

    # Then each stage's requirements match exactly one Mac of the region, and not the same one
    def macs(name: str) -> list[str]:
        wanted = stages[name].requires.items()
        return [mac for mac in FLEET[project.region_affinity] if wanted <= LABELS.get(mac, {}).items()]

    assert len(macs(FIRST)) == len(macs(SECOND)) == 1
    assert macs(FIRST) != macs(SECOND)
    # And both use the one cache, keyed on the lock file
    assert stages[FIRST].cache == stages[SECOND].cache == ("venv",)
    [venv] = project.caches
    assert "{hash:requirements.lock}" in venv.key
