"""Log masking and chunking, without AWS: the shipper writes to a recording sink (its own seam)."""

from __future__ import annotations

import threading
from datetime import datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relevo_agent.logs import MASK, LogShipper, Masker, secret_values
from relevo_core.store.stage_attempts import LeaseLost

CANARY = "canary-7f3a9c2e-SECRET"


class RecordingSink:
    def __init__(self, fail_first: int = 0, lease_lost_after: int | None = None) -> None:
        self.chunks: list[tuple[int, str]] = []
        self.fail_first = fail_first
        self.lease_lost_after = lease_lost_after
        self.calls = 0

    def append_many(self, texts: list[str], now: datetime) -> list[int]:
        return [self.append(text, now) for text in texts]

    def append(self, data: str, now: datetime) -> int:
        self.calls += 1
        if self.calls <= self.fail_first:
            raise ConnectionError("network down")
        if self.lease_lost_after is not None and len(self.chunks) >= self.lease_lost_after:
            raise LeaseLost("taken over")
        self.chunks.append((len(self.chunks), data))
        return len(self.chunks) - 1


def mask_all(secrets: list[str], pieces: list[bytes]) -> str:
    masker = Masker(secrets)
    return "".join(masker.feed(p) for p in pieces) + masker.flush()


def test_a_secret_split_across_two_reads_is_masked():
    # Given a secret whose value arrives in two reads of the pipe
    data = f"token={CANARY} done\n".encode()
    cut = data.index(b"SECRET")
    # When the two halves are masked one after the other
    text = mask_all([CANARY], [data[:cut], data[cut:]])
    # Then the whole value is replaced and nothing of it is released
    assert text == f"token={MASK} done\n"


@settings(max_examples=200, deadline=None)
@given(
    before=st.text(max_size=40),
    after=st.text(max_size=40),
    cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=6),
)
def test_masking_does_not_depend_on_where_reads_split(before: str, after: str, cuts: list[int]):
    data = f"{before}{CANARY}{after}{CANARY}".encode()
    points = sorted({min(c, len(data)) for c in cuts})
    pieces = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
    text = mask_all([CANARY, "other-secret"], pieces)
    assert CANARY not in text
    assert text == data.decode().replace(CANARY, MASK)


def test_the_longer_of_two_overlapping_secrets_is_masked_whole():
    assert mask_all(["abc", "abcdef"], [b"x abcdef y abc"]) == f"x {MASK} y {MASK}"


def test_multibyte_characters_split_across_reads_survive():
    data = "héllo wörld ✓\n".encode()
    assert mask_all([], [data[:2], data[2:13], data[13:]]) == "héllo wörld ✓\n"


def test_only_set_and_non_empty_variables_are_secrets():
    assert secret_values(["A", "B", "C"], {"A": "x1", "B": "", "D": "y"}) == ["x1"]


def test_chunks_keep_every_line_in_order_and_never_the_secret():
    # Given a shipper with small chunks and a small memory bound (so text spills to disk)
    sink = RecordingSink()
    shipper = LogShipper(
        sink, Masker([CANARY]), max_chunk_bytes=100, max_buffer_chars=300, flush_interval_sec=0.01
    )
    lines = [f"line {i:05d} {CANARY if i % 7 == 0 else ''}\n" for i in range(2000)]
    blob = "".join(lines).encode()
    # When output arrives in reads that cut lines and secrets anywhere (before the shipper runs)
    for start in range(0, len(blob), 37):
        shipper.write(blob[start : start + 37])
    shipper.start()
    stats = shipper.close(timeout_sec=30)
    # Then the chunks are in seq order, hold every line once and in order, and no secret
    assert [seq for seq, _ in sink.chunks] == list(range(len(sink.chunks)))
    assert all(len(data.encode()) <= 100 for _, data in sink.chunks)
    text = "".join(data for _, data in sink.chunks)
    assert CANARY not in text
    assert text == "".join(lines).replace(CANARY, MASK)
    assert stats.spilled_chars > 0, "the memory bound was exceeded, so text went through the spool"
    assert stats.chunks == len(sink.chunks)


def test_write_never_waits_for_the_sink():
    # Given a sink that blocks until released
    release = threading.Event()

    class BlockedSink(RecordingSink):
        def append(self, data: str, now: datetime) -> int:
            release.wait(10)
            return super().append(data, now)

    sink = BlockedSink()
    shipper = LogShipper(
        sink, Masker([]), max_chunk_bytes=1000, max_buffer_chars=5000, flush_interval_sec=0.01
    ).start()
    # When far more than the buffer is written while the sink is stuck
    for i in range(2000):
        shipper.write(f"{i}\n".encode() * 10)
    # Then every write returned (the writer got here), and nothing is lost once the sink recovers
    release.set()
    shipper.close(timeout_sec=30)
    assert "".join(d for _, d in sink.chunks) == "".join(f"{i}\n" * 10 for i in range(2000))


def test_failed_stores_are_retried_with_the_same_text():
    sink = RecordingSink(fail_first=2)
    shipper = LogShipper(sink, Masker([]), flush_interval_sec=0.01, retry_sec=0.01).start()
    shipper.line("hello")
    stats = shipper.close(timeout_sec=10)
    assert sink.chunks == [(0, "hello\n")]
    assert stats.retries == 2


def test_a_lost_lease_stops_shipping():
    sink = RecordingSink(lease_lost_after=1)
    shipper = LogShipper(sink, Masker([]), max_chunk_bytes=10, flush_interval_sec=0.01)
    shipper.write(b"0123456789abcdefghij0123456789")
    stats = shipper.start().close(timeout_sec=10)
    assert stats.fenced
    assert sink.chunks == [(0, "0123456789")]


@pytest.mark.parametrize("secret", ["s", "ab"])
def test_short_secrets_are_masked_too(secret: str):
    assert secret not in mask_all([secret], [b"x", secret.encode()[:1], secret.encode()[1:], b"y"])


def test_chunks_are_cut_by_utf8_bytes_never_inside_a_character():
    # Given text of 1-, 2-, 3- and 4-byte characters, more than the memory bound
    text = "aé✓😀" * 300
    sink = RecordingSink()
    shipper = LogShipper(sink, Masker([]), max_chunk_bytes=10, max_buffer_chars=100, flush_interval_sec=0.01)
    for start in range(0, len(text), 7):
        shipper.write(text[start : start + 7].encode())
    stats = shipper.start().close(timeout_sec=30)
    # Then no chunk is over the byte limit, and the chunks join to the text exactly
    assert stats.spilled_chars > 0
    assert max(len(data.encode()) for _, data in sink.chunks) <= 10
    assert "".join(data for _, data in sink.chunks) == text
