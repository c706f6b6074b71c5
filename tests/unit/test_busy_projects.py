"""intake.busy_projects: a project whose lock refused a job is remembered as busy for
BUSY_PROJECT_MEMORY_SEC on the container's monotonic clock, and only a refusal extends it."""

from __future__ import annotations

from relevo_core.config import IntakeSettings
from relevo_core.intake.busy_projects import BusyProjects


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_refusal_is_remembered_for_its_memory_and_no_longer():
    clock = Clock()
    busy = BusyProjects(clock)
    assert not busy.seems_busy("t", "ios-app")
    busy.found_busy("t", "ios-app", 10)
    assert busy.seems_busy("t", "ios-app")
    assert not busy.seems_busy("t", "mac-app") and not busy.seems_busy("other-table", "ios-app")
    clock.now += 9.9
    assert busy.seems_busy("t", "ios-app")
    clock.now += 0.1
    assert not busy.seems_busy("t", "ios-app")


def test_only_a_new_refusal_extends_the_memory():
    clock = Clock()
    busy = BusyProjects(clock)
    busy.found_busy("t", "ios-app", 10)
    clock.now += 8
    for _ in range(5):  # jobs written queued from memory learn nothing of the lock
        assert busy.seems_busy("t", "ios-app")
    clock.now += 2
    assert not busy.seems_busy("t", "ios-app")
    busy.found_busy("t", "ios-app", 10)
    clock.now += 9
    assert busy.seems_busy("t", "ios-app")


def test_a_job_that_took_the_lock_ends_the_memory():
    busy = BusyProjects(Clock())
    busy.found_busy("t", "ios-app", 10)
    busy.found_free("t", "ios-app")
    assert not busy.seems_busy("t", "ios-app")


def test_a_memory_of_zero_remembers_nothing():
    busy = BusyProjects(Clock())
    busy.found_busy("t", "ios-app", 0)
    assert not busy.seems_busy("t", "ios-app")


def test_lapsed_projects_are_let_go_once_many_are_remembered():
    clock = Clock()
    busy = BusyProjects(clock)
    for n in range(1024):
        busy.found_busy("t", f"p{n}", 1)
    clock.now += 2
    busy.found_busy("t", "ios-app", 10)
    assert list(busy._until) == [("t", "ios-app")]


def test_the_memory_defaults_to_ten_seconds_and_is_taken_from_the_environment(monkeypatch):
    for name, value in {
        "TABLE_NAME": "relevo-jobs",
        "STATE_MACHINE_ARN": "arn:aws:states:eu-west-1:123456789012:stateMachine:run",
        "QUEUED_STATE_MACHINE_ARN": "arn:aws:states:eu-west-1:123456789012:stateMachine:queued",
        "ARTIFACT_BUCKET": "b",
        "WORK_QUEUE_PREFIX": "relevo-work-",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("BUSY_PROJECT_MEMORY_SEC", raising=False)
    assert IntakeSettings.from_environ().busy_project_memory_sec == 10
    monkeypatch.setenv("BUSY_PROJECT_MEMORY_SEC", "0")
    assert IntakeSettings.from_environ().busy_project_memory_sec == 0
