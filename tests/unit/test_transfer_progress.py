"""Issue 18, the Steps' transfer progress: the agent's ProgressWriter keeps an upload's files and
bytes in memory and hands a lease renewal a reading at most every `interval_sec`, only when it
changed; the upload's end is written at once, and nothing older is written after it."""

from __future__ import annotations

import threading
from datetime import UTC, datetime

import pytest

from relevo_agent.transfer import ProgressWriter
from relevo_core.models.transfer import TransferProgress, TransferState
from relevo_core.store import stage_attempts
from relevo_core.store.stage_attempts import StageRef

REF = StageRef("table", "job_x", 0, 2, "mac-a")
MIB = 1024 * 1024


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _writer(clock: Clock, interval: float = 2.0) -> ProgressWriter:
    return ProgressWriter(REF, interval, clock=clock, wall=lambda: datetime(2026, 12, 1, tzinfo=UTC))


def _ride(writer: ProgressWriter) -> TransferProgress | None:
    """One lease renewal that came back: what it carried."""
    with writer.riding() as reading:
        return reading


@pytest.fixture()
def final_writes(monkeypatch: pytest.MonkeyPatch) -> list[TransferProgress]:
    written: list[TransferProgress] = []
    monkeypatch.setattr(stage_attempts, "record_transfer", lambda ref, reading: written.append(reading))
    return written


def test_renewals_carry_a_reading_at_most_every_interval_and_only_when_it_changed(final_writes):
    # Given an upload of 5 files, 10 MiB, and a writer of a 2 s interval
    clock = Clock()
    writer = _writer(clock)
    assert _ride(writer) is None  # before the upload starts there is nothing to say
    writer.start(5, 10 * MIB)
    writer.begin("a.ipa")
    # When s3transfer calls back hundreds of times between two renewals
    for _ in range(400):
        writer.sent(1024)
    first = _ride(writer)
    # Then the first renewal after the start carries one reading of all of them
    assert first is not None and (first.state, first.files_done, first.bytes_done, first.current_file) == (
        TransferState.UPLOADING,
        0,
        400 * 1024,
        "a.ipa",
    )
    assert first.attempt == 2
    # and the next renewals within the interval carry none, however much was sent
    writer.sent(MIB)
    clock.now += 1.9
    assert _ride(writer) is None
    # once the interval has passed, the next renewal carries the news
    clock.now += 0.1
    second = _ride(writer)
    assert second is not None and second.bytes_done == 400 * 1024 + MIB
    # and with nothing new since, later renewals carry nothing
    clock.now += 10
    assert _ride(writer) is None
    assert final_writes == []  # the upload's side never wrote anything itself


def test_a_renewal_that_failed_leaves_the_reading_due_for_the_next(final_writes):
    clock = Clock()
    writer = _writer(clock)
    writer.start(1, MIB)
    writer.sent(10)
    with pytest.raises(ConnectionResetError):
        with writer.riding() as reading:
            assert reading is not None
            raise ConnectionResetError("the renewal did not come back")
    again = _ride(writer)  # no interval to wait: nothing was written
    assert again is not None and again.bytes_done == 10


def test_the_end_is_written_at_once_and_no_older_reading_after_it(final_writes):
    # Given an upload that just wrote a reading with a renewal
    clock = Clock()
    writer = _writer(clock)
    writer.start(2, 3 * MIB)
    writer.begin("a.ipa")
    writer.sent(MIB)
    assert _ride(writer) is not None
    writer.file_done()
    writer.begin("b.dSYM.zip")
    writer.sent(2 * MIB)
    writer.file_done()
    # When it ends, well within the interval
    writer.finish(succeeded=True)
    # Then its totals are written at once
    assert [(r.state, r.files_done, r.bytes_done, r.current_file) for r in final_writes] == [
        (TransferState.UPLOADED, 2, 3 * MIB, None)
    ]
    assert final_writes[0].describe() == "2 files, 3.0 MiB uploaded"
    # and no renewal carries a reading after it, however long it waits
    clock.now += 60
    assert _ride(writer) is None


def test_a_renewal_never_waits_for_the_end_being_written(monkeypatch):
    # Given the end's write hanging on the network
    entered, release = threading.Event(), threading.Event()

    def slow_write(ref, reading):
        entered.set()
        release.wait(10)

    monkeypatch.setattr(stage_attempts, "record_transfer", slow_write)
    clock = Clock()
    writer = _writer(clock)
    writer.start(1, MIB)
    writer.sent(MIB)
    writer.file_done()
    ender = threading.Thread(target=writer.finish, args=(True,))
    ender.start()
    assert entered.wait(5)
    # When a renewal comes meanwhile: it goes at once, without a reading
    clock.now += 5
    done = threading.Event()
    threading.Thread(target=lambda: (_ride(writer), done.set())).start()
    assert done.wait(1), "the renewal waited for the transfer's write"
    release.set()
    ender.join(5)


def test_a_failed_upload_says_how_far_it_got(final_writes):
    clock = Clock()
    writer = _writer(clock)
    writer.start(5, 1200 * MIB)
    writer.begin("a")
    writer.sent(400 * MIB)
    writer.file_done()
    writer.begin("b")
    writer.sent(12 * MIB)
    assert _ride(writer).describe() == "uploading 2 of 5 files, 412.0 MiB of 1.2 GiB (34 %)"
    writer.finish_quietly(succeeded=False)
    assert final_writes[-1].describe() == "upload failed after 1 of 5 files, 412.0 MiB of 1.2 GiB (34 %)"


def test_relevo_job_show_prints_each_attempts_transfer():
    from rich.console import Console

    from relevo_cli.job_view import job_notes, render_job

    def reading(attempt: int, state: str, files_done: int, bytes_done: int) -> dict:
        return TransferProgress(
            attempt=attempt,
            state=state,
            files_done=files_done,
            files_total=5,
            bytes_done=bytes_done,
            bytes_total=1200 * MIB,
            updated_at="2026-12-01T12:00:00+00:00",
        ).model_dump(mode="json")

    stage = {
        "index": 0,
        "name": "upload",
        "status": "running",
        "attempt": 2,
        "agent_id": "mac-a",
        "exit_code": None,
        "error_class": None,
        "transfer": reading(2, "uploading", 2, 412 * MIB),
        "transfers": [reading(1, "failed", 1, 100 * MIB), reading(2, "uploading", 2, 412 * MIB)],
    }
    job = {
        "job_id": "j-1",
        "project": "app",
        "status": "running",
        "queue_reason": None,
        "held_reason": None,
        "ref": "main",
        "region_affinity": "eu",
        "stages": [stage],
    }
    out = Console(width=250, record=True)
    out.print(render_job(job))
    assert "uploading 3 of 5 files, 412.0 MiB of 1.2 GiB (34 %)" in out.export_text()
    assert "upload attempt 1: upload failed after 1 of 5 files, 100.0 MiB of 1.2 GiB (8 %)" in job_notes(job)


def test_a_lost_end_write_does_not_fail_a_stored_upload_but_a_refused_one_says_so(monkeypatch):
    from botocore.exceptions import EndpointConnectionError

    writer = _writer(Clock())
    writer.start(1, 10)

    def lost(ref, reading):
        raise EndpointConnectionError(endpoint_url="https://dynamodb")

    monkeypatch.setattr(stage_attempts, "record_transfer", lost)
    writer.finish(succeeded=True)  # logged only: the artifacts are stored and recorded

    def refused(ref, reading):
        raise stage_attempts.LeaseLost("job_x stage 0 attempt 2")

    monkeypatch.setattr(stage_attempts, "record_transfer", refused)
    fenced = _writer(Clock())
    fenced.start(1, 10)
    with pytest.raises(stage_attempts.LeaseLost):  # the stage's fenced flag is set by its caller
        fenced.finish(succeeded=True)
    fenced.finish_quietly(succeeded=False)  # after a failed upload: logged only
