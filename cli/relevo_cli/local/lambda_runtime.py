"""Runs each function of the template the way Lambda does: its own process, its own
environment (from the deployed function's configuration), its code and layers on sys.path,
one event at a time per process. moto's Lambda needs Docker to run code; this does not."""

from __future__ import annotations

import importlib
import multiprocessing
import os
import queue
import sys
import threading
import traceback
import uuid
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

_BASE_ENV = ("PATH", "HOME", "LANG", "TMPDIR", "SYSTEMROOT", "PYTHONHASHSEED")


@dataclass
class _Context:
    """The parts of LambdaContext that Powertools reads."""

    function_name: str
    memory_limit_in_mb: int
    invoked_function_arn: str
    aws_request_id: str
    log_group_name: str = ""
    log_stream_name: str = ""
    function_version: str = "$LATEST"

    def get_remaining_time_in_millis(self) -> int:
        return 15_000


def _worker_main(conn: Connection, code_dir: str, layer_dirs: list[str], handler: str, env: dict[str, str]) -> None:
    for name in list(os.environ):
        if name not in _BASE_ENV:
            del os.environ[name]
    os.environ.update(env)
    sys.path[:0] = [code_dir, *layer_dirs]
    module_name, function_name = handler.rsplit(".", 1)
    try:
        entry = getattr(importlib.import_module(module_name), function_name)
    except Exception:  # the import failure is the invocation's answer
        failure = traceback.format_exc()
        entry = None
    conn.send(("ready", None))  # the init phase is over, as after a Lambda cold start
    while True:
        message = conn.recv()
        if message is None:
            return
        event, context_fields = message
        if entry is None:
            conn.send(("error", failure))
            continue
        try:
            conn.send(("ok", entry(event, _Context(**context_fields))))
        except Exception:  # a crashed invocation is a 502 from API Gateway, not a dead runtime
            conn.send(("error", traceback.format_exc()))


class FunctionRuntime:
    """Warm processes for one function: one at start, more (each with its own cold start) when
    every process is busy, up to `max_concurrency`, the way Lambda scales out."""

    def __init__(
        self,
        name: str,
        arn: str,
        code_dir: str,
        layer_dirs: list[str],
        handler: str,
        env: dict[str, str],
        memory_mb: int = 512,
        max_concurrency: int = 4,
    ) -> None:
        self.name = name
        self.arn = arn
        self.memory_mb = memory_mb
        self.max_concurrency = max_concurrency
        self._args = (code_dir, layer_dirs, handler, env)
        self._context = multiprocessing.get_context("spawn")
        self._idle: queue.Queue[tuple[Any, Connection]] = queue.Queue()
        self._processes: list[Any] = []
        self._grow_lock = threading.Lock()
        self._first = self._spawn()

    def _spawn(self) -> tuple[Any, Connection]:
        parent, child = self._context.Pipe()
        process = self._context.Process(target=_worker_main, args=(child, *self._args), daemon=True)
        process.start()
        self._processes.append(process)
        return process, parent

    @staticmethod
    def _await_ready(worker: tuple[Any, Connection], timeout: float) -> None:
        if not worker[1].poll(timeout):
            raise TimeoutError(f"runtime not ready after {timeout}s")
        worker[1].recv()

    def wait_ready(self, timeout: float = 120) -> None:
        """Block until the first process has imported its handler (the cold start is paid here)."""
        self._await_ready(self._first, timeout)
        self._idle.put(self._first)

    def _acquire(self) -> tuple[Any, Connection]:
        try:
            return self._idle.get_nowait()
        except queue.Empty:
            pass
        with self._grow_lock:
            grow = len(self._processes) < self.max_concurrency
            worker = self._spawn() if grow else None
        if worker is None:
            return self._idle.get()
        self._await_ready(worker, 120)
        return worker

    def invoke(self, event: dict[str, Any]) -> Any:
        worker = self._acquire()
        try:
            worker[1].send(
                (
                    event,
                    {
                        "function_name": self.name,
                        "memory_limit_in_mb": self.memory_mb,
                        "invoked_function_arn": self.arn,
                        "aws_request_id": str(uuid.uuid4()),
                    },
                )
            )
            status, value = worker[1].recv()
        finally:
            self._idle.put(worker)
        if status != "ok":
            raise RuntimeError(f"{self.name} failed:\n{value}")
        return value

    def stop(self) -> None:
        while not self._idle.empty():
            _, conn = self._idle.get_nowait()
            try:
                conn.send(None)
            except (BrokenPipeError, OSError):
                pass
        for process in self._processes:
            process.join(timeout=2)
            if process.is_alive():
                process.kill()
