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
    """A small pool of warm processes for one function."""

    def __init__(
        self,
        name: str,
        arn: str,
        code_dir: str,
        layer_dirs: list[str],
        handler: str,
        env: dict[str, str],
        memory_mb: int = 512,
        concurrency: int = 2,
    ) -> None:
        self.name = name
        self.arn = arn
        self.memory_mb = memory_mb
        self._idle: queue.Queue[tuple[Any, Connection]] = queue.Queue()
        context = multiprocessing.get_context("spawn")
        self._processes = []
        self._starting: list[tuple[Any, Connection]] = []
        for _ in range(concurrency):
            parent, child = context.Pipe()
            process = context.Process(
                target=_worker_main, args=(child, code_dir, layer_dirs, handler, env), daemon=True
            )
            process.start()
            self._processes.append(process)
            self._starting.append((process, parent))

    def wait_ready(self, timeout: float = 120) -> None:
        """Block until every process has imported its handler (the cold start is paid here)."""
        for process, conn in self._starting:
            if not conn.poll(timeout):
                raise TimeoutError(f"{self.name}: runtime not ready after {timeout}s")
            conn.recv()
            self._idle.put((process, conn))
        self._starting.clear()

    def invoke(self, event: dict[str, Any]) -> Any:
        process, conn = self._idle.get()
        try:
            conn.send(
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
            status, value = conn.recv()
        finally:
            self._idle.put((process, conn))
        if status != "ok":
            raise RuntimeError(f"{self.name} failed:\n{value}")
        return value

    def stop(self) -> None:
        while not self._idle.empty():
            process, conn = self._idle.get_nowait()
            try:
                conn.send(None)
            except (BrokenPipeError, OSError):
                pass
        for process in self._processes:
            process.join(timeout=2)
            if process.is_alive():
                process.kill()
