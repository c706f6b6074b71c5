"""A loopback TCP fault proxy: what sits between one relevo-agent and its AWS endpoint in
`relevo-tools drill` and in the fencing tests.

It binds 127.0.0.1 only and forwards bytes both ways, in one of four modes that can change at
any moment:

- `pass`: bytes go through untouched.
- `partition`: a black hole. Nothing crosses in either direction, on open connections or new
  ones (the kernel still completes a new connection's handshake; its bytes are held). When the
  partition heals, what was held is delivered, as TCP's retransmissions would, unless the side
  that sent it has given up and closed meanwhile.
- `reset`: each connection is reset with probability `reset_probability`, once, at its first
  request after the mode was set (a new connection at its first), before anything of that request
  is forwarded: the agent sees "connection reset by peer" (an RST, SO_LINGER 0) and the service
  never sees the request. A connection spared carries its requests on; the agent's next
  connection draws again. With `resets_left`, the proxy passes again after that many resets.
- `latency`: each chunk from the agent is forwarded `latency_sec` after it arrived (requests keep
  their order and are not serialised behind each other's delays).

A cut can be armed on top (`cut_at`): the first request whose bytes carry a marker (a request
line) either lands (it is forwarded whole, its answer dropped) or does not (dropped), its
connection is reset, and every request after it is reset too for `cut_sec`, then the proxy passes
again by itself: the network gone at the moment of that request. One cut armed on several proxies
(`arm_cut`) fires on the first that sees its request, and on no other.

Every loop ends by itself: a connection's pumps end at either side's EOF, after `idle_sec`
without a byte, or when the proxy closes; a held partition ends at heal or close; and the proxy
closes itself after `lifetime_sec` even if nobody calls close().
"""

from __future__ import annotations

import asyncio
import random
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

LOOPBACK = "127.0.0.1"


class Mode(str, Enum):
    PASS = "pass"
    PARTITION = "partition"
    RESET = "reset"
    LATENCY = "latency"


@dataclass
class ProxyStats:
    connections: int = 0
    requests: int = 0
    resets: int = 0
    held_chunks: int = 0
    cuts: int = 0


@dataclass(frozen=True)
class Cut:
    marker: bytes  # what the request's first chunk carries (its request line)
    lands: bool  # forwarded whole (its answer lost) or dropped
    cut_sec: float  # how long every request after it is reset
    _once: threading.Lock = field(default_factory=threading.Lock, compare=False, repr=False)

    def take(self) -> bool:
        """True for the first proxy that fires it, False for every other."""
        return self._once.acquire(blocking=False)


class _Closing(Exception):
    """The connection is being torn down (reset, close, idle)."""


class FaultProxy:
    def __init__(
        self,
        target: tuple[str, int],
        lifetime_sec: float = 3600.0,
        idle_sec: float = 300.0,
        seed: int | None = None,
    ) -> None:
        self.target = target
        self.lifetime_sec = lifetime_sec
        self.idle_sec = idle_sec
        self.mode = Mode.PASS
        self.latency_sec = 0.5
        self.reset_probability = 1.0
        self.resets_left: int | None = None
        self.stats = ProxyStats()
        self._cut: Cut | None = None
        self.port = 0
        self._epoch = 0  # bumped by every set_mode: a connection's reset is drawn once per epoch
        self._random = random.Random(seed)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._flowing: asyncio.Event | None = None
        self._closed: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"fault-proxy->{target[1]}", daemon=True)

    # ------------------------------------------------------------------ control (any thread)
    def start(self) -> FaultProxy:
        self._thread.start()
        if not self._ready.wait(10) or not self.port:
            raise RuntimeError("the fault proxy did not start")
        return self

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def set_mode(
        self,
        mode: Mode | str,
        latency_sec: float | None = None,
        reset_probability: float | None = None,
        resets_left: int | None = None,
    ) -> None:
        mode = Mode(mode)
        if latency_sec is not None:
            self.latency_sec = latency_sec
        if reset_probability is not None:
            self.reset_probability = reset_probability
        self.resets_left = resets_left
        self.mode = mode
        self._epoch += 1
        self._call(self._apply_mode)

    def partition(self) -> None:
        self.set_mode(Mode.PARTITION)

    def heal(self) -> None:
        """Passing again, and no cut left armed."""
        self._cut = None
        self.set_mode(Mode.PASS)

    def cut_at(self, marker: bytes, lands: bool, cut_sec: float) -> Cut:
        """The cut armed for the next request carrying `marker` (see the module's docstring)."""
        cut = Cut(marker, lands, cut_sec)
        self.arm_cut(cut)
        return cut

    def arm_cut(self, cut: Cut) -> None:
        self._cut = cut

    def close(self) -> None:
        self._call(lambda: self._closed.set() if self._closed else None)
        self._thread.join(timeout=10)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.close()

    def _call(self, action: Callable[[], object]) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(action)
            except RuntimeError:  # the loop stopped meanwhile
                pass

    # ------------------------------------------------------------------ the loop (its own thread)
    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        finally:
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._flowing = asyncio.Event()
        self._closed = asyncio.Event()
        self._apply_mode()
        server = await asyncio.start_server(self._connection, LOOPBACK, 0)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        try:
            await asyncio.wait_for(self._closed.wait(), timeout=self.lifetime_sec)
        except TimeoutError:
            pass  # the lifetime is over: close by itself
        self._closed.set()
        self._flowing.set()  # nothing stays held
        server.close()
        for task in [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]:
            task.cancel()
        await server.wait_closed()

    def _apply_mode(self) -> None:
        if self._flowing is None:
            return
        if self.mode is Mode.PARTITION:
            self._flowing.clear()
        else:
            self._flowing.set()

    async def _connection(
        self, agent_reader: asyncio.StreamReader, agent_writer: asyncio.StreamWriter
    ) -> None:
        self.stats.connections += 1
        upstream_writer: asyncio.StreamWriter | None = None
        drawn = [-1]  # the epoch this connection's reset was drawn in
        answer_lost = [False]  # a cut request went through on it: its answer is dropped
        try:
            try:
                upstream_reader, upstream = await asyncio.wait_for(asyncio.open_connection(*self.target), 10)
            except (TimeoutError, OSError):
                return
            upstream_writer = upstream
            await asyncio.gather(
                self._pump(agent_reader, upstream, True, agent_writer, drawn, answer_lost),
                self._pump(upstream_reader, agent_writer, False, upstream, drawn, answer_lost),
            )
        except _Closing as why:
            if str(why) == "reset":
                self.stats.resets += 1
                if self.resets_left is not None:
                    self.resets_left -= 1
                    if self.resets_left <= 0:
                        self.mode, self.resets_left = Mode.PASS, None
                _reset(agent_writer)
                if upstream_writer is not None:
                    _reset(upstream_writer)
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            for writer in (agent_writer, upstream_writer):
                if writer is not None:
                    writer.close()

    async def _pump(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        from_agent: bool,
        peer: asyncio.StreamWriter,
        drawn: list[int],
        answer_lost: list[bool],
    ) -> None:
        """One direction of a connection. A reset tears down both directions (_Closing)."""
        assert self._flowing is not None and self._closed is not None
        pending: list[asyncio.Task[None]] = []
        try:
            while True:
                try:
                    data = await asyncio.wait_for(reader.read(65536), timeout=self.idle_sec)
                except TimeoutError:
                    raise _Closing("idle") from None
                if not data:
                    break
                if not from_agent and answer_lost[0]:
                    raise _Closing("reset")  # the cut request's answer never reaches the agent
                cut = self._cut if from_agent else None
                if cut is not None and cut.marker in data:
                    self._cut = None
                    if cut.take():  # not fired yet on another proxy it is armed on
                        self._start_cut(cut)
                        if not cut.lands:
                            raise _Closing("reset")
                        drawn[0], answer_lost[0] = self._epoch, True  # the rest of this request goes on
                if from_agent:
                    self.stats.requests += 1
                    if self.mode is Mode.RESET and drawn[0] != self._epoch:
                        drawn[0] = self._epoch
                        if self._random.random() < self.reset_probability:
                            raise _Closing("reset")
                if not self._flowing.is_set():
                    self.stats.held_chunks += 1
                    await self._flowing.wait()
                    if self._closed.is_set() or reader.at_eof():
                        raise _Closing("gone")  # its sender gave up during the partition
                if from_agent and self.mode is Mode.LATENCY:
                    due = time.monotonic() + self.latency_sec
                    # Delivered in order, each after its own delay: a chain of delayed writes.
                    previous = pending[-1] if pending else None
                    pending = [t for t in pending if not t.done()]
                    pending.append(asyncio.ensure_future(self._write_at(writer, data, due, previous)))
                    continue
                if pending:
                    await asyncio.gather(*pending)
                    pending = []
                writer.write(data)
                await writer.drain()
            if pending:
                await asyncio.gather(*pending)
            # The sending side is done: half-close, so the other side sees EOF too.
            if writer.can_write_eof():
                writer.write_eof()
        except (ConnectionError, OSError):
            peer.close()

    def _start_cut(self, cut: Cut) -> None:
        """Every request reset from now for `cut.cut_sec`, then passing again (on the loop)."""
        assert self._loop is not None
        self.stats.cuts += 1
        self.mode, self.reset_probability, self.resets_left = Mode.RESET, 1.0, None
        self._epoch += 1
        epoch = self._epoch
        self._apply_mode()

        def end() -> None:
            if self._epoch == epoch:  # nobody changed the mode since
                self.mode = Mode.PASS
                self._epoch += 1
                self._apply_mode()

        self._loop.call_later(cut.cut_sec, end)

    @staticmethod
    async def _write_at(
        writer: asyncio.StreamWriter, data: bytes, due: float, previous: asyncio.Task[None] | None
    ) -> None:
        if previous is not None:
            await previous
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        writer.write(data)
        await writer.drain()


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with an RST rather than a FIN: SO_LINGER on, zero timeout."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    writer.transport.abort()


class FaultProxies:
    """Every path of one agent to the stack (AWS's endpoint and the stack's API, where it claims),
    each behind a FaultProxy, faulted together: a partition cuts the agent off from both."""

    def __init__(self, proxies: list[FaultProxy]) -> None:
        self.proxies = proxies

    def set_mode(self, mode: Mode | str, **settings: Any) -> None:
        for proxy in self.proxies:
            proxy.set_mode(mode, **settings)

    def partition(self) -> None:
        self.set_mode(Mode.PARTITION)

    def heal(self) -> None:
        self.set_mode(Mode.PASS)

    def close(self) -> None:
        for proxy in self.proxies:
            proxy.close()
