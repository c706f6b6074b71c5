"""The loopback fault proxy of `relevo-tools drill` and the fencing tests: each mode, against a small
echo server, with real sockets."""

from __future__ import annotations

import socket
import socketserver
import threading
import time
from collections.abc import Iterator

import pytest

from relevo_tools.drill.proxy import Cut, FaultProxy, Mode


class _Echo(socketserver.BaseRequestHandler):
    received: list[bytes] = []

    def handle(self) -> None:
        while data := self.request.recv(65536):
            _Echo.received.append(data)
            self.request.sendall(data)


@pytest.fixture()
def echo() -> Iterator[tuple[str, int]]:
    _Echo.received = []
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address  # type: ignore[misc]  # an AF_INET (host, port)
    server.shutdown()
    server.server_close()


@pytest.fixture()
def proxy(echo: tuple[str, int]) -> Iterator[FaultProxy]:
    with FaultProxy(echo, seed=1) as running:
        yield running


def _connect(proxy: FaultProxy, timeout: float = 2) -> socket.socket:
    return socket.create_connection(("127.0.0.1", proxy.port), timeout=timeout)


def test_it_listens_on_loopback_only_and_passes_bytes_both_ways(proxy: FaultProxy):
    with _connect(proxy) as conn:
        assert conn.getpeername()[0] == "127.0.0.1"
        conn.sendall(b"ping")
        assert conn.recv(100) == b"ping"
    assert proxy.url == f"http://127.0.0.1:{proxy.port}"


def test_a_partition_holds_every_byte_until_it_heals(proxy: FaultProxy):
    with _connect(proxy) as conn:
        proxy.partition()
        conn.sendall(b"renew")
        with pytest.raises(socket.timeout):
            conn.settimeout(0.5)
            conn.recv(100)
        assert _Echo.received == []  # nothing reached the other side
        with _connect(proxy) as fresh:  # a new connection is accepted, and held too
            fresh.sendall(b"claim")
            fresh.settimeout(0.3)
            with pytest.raises(socket.timeout):
                fresh.recv(100)
            proxy.heal()
            fresh.settimeout(2)
            assert fresh.recv(100) == b"claim"
        conn.settimeout(2)
        assert conn.recv(100) == b"renew"  # delivered late, as TCP would


def test_a_partition_drops_what_a_sender_gave_up_on(proxy: FaultProxy):
    proxy.partition()
    conn = _connect(proxy)
    conn.sendall(b"late")
    time.sleep(0.2)
    conn.close()  # the client timed out and closed
    time.sleep(0.2)
    proxy.heal()
    time.sleep(0.3)
    assert _Echo.received == []


def test_reset_mode_resets_connections_before_a_request_is_forwarded(proxy: FaultProxy):
    with _connect(proxy) as conn:
        conn.sendall(b"first")
        assert conn.recv(100) == b"first"
        proxy.set_mode(Mode.RESET, reset_probability=1.0)
        conn.sendall(b"second")
        with pytest.raises(ConnectionResetError):
            conn.recv(100)
    assert _Echo.received == [b"first"]
    assert proxy.stats.resets == 1
    proxy.heal()
    with _connect(proxy) as conn:
        conn.sendall(b"third")
        assert conn.recv(100) == b"third"


def test_latency_delays_each_request_without_serialising_them(proxy: FaultProxy):
    latency = 1.0
    proxy.set_mode(Mode.LATENCY, latency_sec=latency)
    with _connect(proxy) as conn:
        started = time.monotonic()
        conn.sendall(b"a")
        assert conn.recv(100) == b"a"
        one = time.monotonic() - started
        started = time.monotonic()
        conn.sendall(b"b")
        time.sleep(0.1)
        conn.sendall(b"c")
        got = b""
        while len(got) < 2:
            got += conn.recv(100)
        two = time.monotonic() - started
    assert one >= latency
    assert got == b"bc"
    # c waited its own latency, not b's and then its own: serialised would be 0.1 + 2 x latency.
    assert latency <= two < 2 * latency


def test_the_proxy_ends_by_itself_after_its_lifetime(echo: tuple[str, int]):
    proxy = FaultProxy(echo, lifetime_sec=0.5).start()
    conn = _connect(proxy)
    proxy.partition()
    conn.sendall(b"held")
    proxy._thread.join(timeout=5)
    assert not proxy._thread.is_alive()
    conn.settimeout(2)
    assert conn.recv(100) == b""  # closed, not left hanging
    with pytest.raises(OSError):
        _connect(proxy, timeout=0.5)


def test_reset_mode_can_stop_by_itself_after_so_many_resets(proxy: FaultProxy):
    proxy.set_mode(Mode.RESET, reset_probability=1.0, resets_left=2)
    for _ in range(2):
        with _connect(proxy) as conn:
            conn.sendall(b"x")
            with pytest.raises(ConnectionResetError):
                conn.recv(100)
    with _connect(proxy) as conn:
        conn.sendall(b"through")
        assert conn.recv(100) == b"through"
    assert proxy.mode is Mode.PASS and proxy.stats.resets == 2


def _passing_again(proxy: FaultProxy, within: float = 5) -> None:
    deadline = time.monotonic() + within
    while proxy.mode is not Mode.PASS:
        assert time.monotonic() < deadline, "the cut did not end by itself"
        time.sleep(0.02)


def test_a_cut_request_that_lands_is_forwarded_whole_and_its_answer_never_comes(proxy: FaultProxy):
    # Given a cut armed at the request carrying COMMIT, to land
    proxy.cut_at(b"COMMIT", lands=True, cut_sec=0.3)
    with _connect(proxy) as conn:
        conn.sendall(b"look")
        assert conn.recv(100) == b"look"  # requests before it pass

        # When the request arrives
        conn.sendall(b"COMMIT file-1")

        # Then it reached the other side, and its answer did not: the connection is reset
        with pytest.raises(ConnectionResetError):
            conn.recv(100)
    assert _Echo.received == [b"look", b"COMMIT file-1"]
    # And every request after it is reset until the cut ends by itself
    with _connect(proxy) as conn:
        conn.sendall(b"look again")
        with pytest.raises(ConnectionResetError):
            conn.recv(100)
    _passing_again(proxy)
    with _connect(proxy) as conn:
        conn.sendall(b"through")
        assert conn.recv(100) == b"through"
    assert proxy.stats.cuts == 1


def test_a_cut_request_that_does_not_land_never_reaches_the_other_side(proxy: FaultProxy):
    # Given a cut armed at the request carrying COMMIT, not to land
    proxy.cut_at(b"COMMIT", lands=False, cut_sec=0.3)

    # When the request arrives, then the connection is reset and nothing of it was forwarded
    with _connect(proxy) as conn:
        conn.sendall(b"COMMIT file-1")
        with pytest.raises(ConnectionResetError):
            conn.recv(100)
    assert _Echo.received == []
    _passing_again(proxy)
    # And the cut is used up: the same request later passes
    with _connect(proxy) as conn:
        conn.sendall(b"COMMIT file-1")
        assert conn.recv(100) == b"COMMIT file-1"


def test_heal_disarms_a_cut_that_never_fired(proxy: FaultProxy):
    # Given a cut armed on a proxy whose agent never sends the request, then healed
    proxy.cut_at(b"COMMIT", lands=False, cut_sec=0.3)
    proxy.heal()

    # When the request comes later (another trial), then it passes
    with _connect(proxy) as conn:
        conn.sendall(b"COMMIT file-2")
        assert conn.recv(100) == b"COMMIT file-2"
    assert proxy.stats.cuts == 0


def test_one_cut_armed_on_two_proxies_fires_on_the_first_request_only(echo: tuple[str, int]):
    # Given one cut armed on the paths of two agents
    with FaultProxy(echo) as first, FaultProxy(echo) as second:
        cut = Cut(b"COMMIT", lands=False, cut_sec=0.3)
        first.arm_cut(cut)
        second.arm_cut(cut)

        # When the first agent's request is cut, and the other agent sends the same request (a retry)
        with _connect(first) as conn:
            conn.sendall(b"COMMIT try-1")
            with pytest.raises(ConnectionResetError):
                conn.recv(100)
        with _connect(second) as conn:
            conn.sendall(b"COMMIT try-2")

            # Then the retry goes through: the cut was used up on the first path
            assert conn.recv(100) == b"COMMIT try-2"
    assert (first.stats.cuts, second.stats.cuts) == (1, 0)
    assert _Echo.received == [b"COMMIT try-2"]
