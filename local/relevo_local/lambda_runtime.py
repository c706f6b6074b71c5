"""Runs each function of the template the way Lambda does: its own processes (execution
environments), the runtime's Python in isolated mode (`-I -S`: no site-packages of this
virtualenv), only the function's code, its layers as `sam build` makes them and the runtime's
boto3 importable, the environment Lambda sets (the function's variables, its execution role's
credentials, the trace header per invocation), one event at a time per process, and the
function's timeout enforced. moto's Lambda needs Docker to run code; this does not.

Each environment's stdout and stderr (the function's logs, EMF metric documents) go to a log file
of the function, as CloudWatch Logs would receive them.
"""

from __future__ import annotations

import json
import os
import queue
import secrets
import select
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from relevo_local.lambda_layer import LambdaPython

BOOTSTRAP = Path(__file__).with_name("lambda_bootstrap.py")
# How often an invocation waiting for an environment checks that one can still come.
_GROW_CHECK_SEC = 1.0
# What a Lambda environment's PATH holds, less /var/lang/bin: the runtime's Python is called by path.
_LAMBDA_PATH = "/usr/local/bin:/usr/bin:/bin"


class FunctionError(RuntimeError):
    """An invocation answered with an error (the handler raised, init failed, or it timed out),
    carrying the error document Lambda would return."""

    def __init__(self, function: str, error: dict[str, Any]) -> None:
        self.error = error
        trace = "".join(error.get("stackTrace") or [])
        super().__init__(f"{function} failed: {error.get('errorType')}: {error.get('errorMessage')}\n{trace}")


@dataclass
class FunctionSpec:
    """Everything Lambda knows about a function when it creates an execution environment."""

    name: str
    arn: str
    code_dir: Path
    layer_dirs: list[Path]
    runtime_dir: Path
    handler: str
    environment: dict[str, str]
    memory_mb: int = 512
    timeout_sec: float = 3.0
    log_file: Path | None = None
    # Called before each new environment starts: the execution role's credentials (Lambda
    # assumes the role for each environment).
    credentials: Any = None
    extra_env: dict[str, str] = field(default_factory=dict)

    def lambda_environment(self, python: LambdaPython) -> dict[str, str]:
        env = {
            "PATH": _LAMBDA_PATH,
            "LANG": "en_US.UTF-8",
            "TZ": ":UTC",
            "TMPDIR": os.environ.get("TMPDIR", "/tmp"),
            "LAMBDA_TASK_ROOT": str(self.code_dir),
            "LAMBDA_RUNTIME_DIR": str(self.runtime_dir),
            "_HANDLER": self.handler,
            "AWS_EXECUTION_ENV": f"AWS_Lambda_python{python.tag}",
            "AWS_LAMBDA_FUNCTION_NAME": self.name,
            "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(self.memory_mb),
            "AWS_LAMBDA_FUNCTION_VERSION": "$LATEST",
            "AWS_LAMBDA_INITIALIZATION_TYPE": "on-demand",
            "AWS_LAMBDA_LOG_GROUP_NAME": f"/aws/lambda/{self.name}",
            "AWS_LAMBDA_LOG_STREAM_NAME": f"{time.strftime('%Y/%m/%d')}/[$LATEST]{secrets.token_hex(16)}",
            "AWS_XRAY_CONTEXT_MISSING": "LOG_ERROR",
            # No ~/.aws of the machine running the stack: Lambda has none either.
            "AWS_CONFIG_FILE": os.devnull,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
            **self.extra_env,
            # Lambda environment values are strings; the emulator keeps Number parameters as ints.
            **{key: str(value) for key, value in self.environment.items()},
        }
        if self.credentials is not None:
            credentials = self.credentials()
            env["AWS_ACCESS_KEY_ID"] = credentials.access_key
            env["AWS_SECRET_ACCESS_KEY"] = credentials.secret_key
            if credentials.token:
                env["AWS_SESSION_TOKEN"] = credentials.token
        return env


def trace_header() -> str:
    """An X-Ray trace header as Lambda sets `_X_AMZN_TRACE_ID` for an invocation (sampled)."""
    return f"Root=1-{int(time.time()):08x}-{secrets.token_hex(12)};Parent={secrets.token_hex(8)};Sampled=1"


class _Environment:
    """One execution environment: a bootstrap process and the two pipes to it."""

    def __init__(self, spec: FunctionSpec, python: LambdaPython, log: IO[bytes] | None) -> None:
        request_read, request_write = os.pipe()
        response_read, response_write = os.pipe()
        command = [
            str(python.executable),
            "-I",
            "-S",
            str(BOOTSTRAP),
            "--request-fd",
            str(request_read),
            "--response-fd",
            str(response_write),
            "--handler",
            spec.handler,
            *(
                arg
                for path in [spec.code_dir, *spec.layer_dirs, spec.runtime_dir]
                for arg in ("--path", str(path))
            ),
        ]
        try:
            self.process = subprocess.Popen(
                command,
                env=spec.lambda_environment(python),
                cwd=str(spec.code_dir),
                stdin=subprocess.DEVNULL,
                stdout=log if log is not None else subprocess.DEVNULL,
                stderr=subprocess.STDOUT if log is not None else subprocess.DEVNULL,
                pass_fds=(request_read, response_write),
                start_new_session=True,
            )
        finally:
            os.close(request_read)
            os.close(response_write)
        self._requests = os.fdopen(request_write, "w", encoding="utf-8")
        self._responses = os.fdopen(response_read, "r", encoding="utf-8")
        self.init_error: dict[str, Any] | None = None

    def read(self, timeout: float) -> dict[str, Any] | None:
        """The next answer, or None when none came within `timeout` (or the process died)."""
        ready, _, _ = select.select([self._responses], [], [], max(0.0, timeout))
        if not ready:
            return None
        line = self._responses.readline()
        return json.loads(line) if line else None

    def send(self, message: dict[str, Any]) -> None:
        self._requests.write(json.dumps(message) + "\n")
        self._requests.flush()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        for pipe in (self._requests, self._responses):
            try:
                pipe.close()
            except OSError:
                pass

    def end_input(self) -> None:
        try:
            self._requests.close()  # end of input: the bootstrap's loop ends
        except OSError:
            pass

    def close(self, deadline: float) -> None:
        """Wait for the process to end after end_input, until the monotonic `deadline`; then kill it."""
        self.end_input()
        try:
            self.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        self.kill()


class FunctionRuntime:
    """Warm environments for one function: one at start, more (each with its own cold start) when
    every environment is busy, up to `max_concurrency`, the way Lambda scales out. An environment
    that timed out or died is replaced by a fresh one on the next invocation.

    One departure from Lambda, for latency: an invocation that finds every environment busy starts
    a new one, and takes whichever environment is free first, the new one or a warm one whose
    invocation ended meanwhile. Lambda would wait for the new one. Its cold start takes about a
    second on Lambda, but here it imports boto3, Powertools and pydantic on the same CPUs as the
    rest of the stack: 3.8-7.0 s for AgentSessionsFunction beside three busy loops on a 2-core host
    (its REPORT lines' Init Duration), while its invocations took 0.1-0.5 s. Waiting for the cold
    start made 3 of 4 shards' simultaneous claims that much slower: on CI, and in that run, claims
    came back with their lease all but spent and were fenced at once."""

    def __init__(
        self, spec: FunctionSpec, python: LambdaPython, max_concurrency: int = 4, init_timeout: float = 120
    ) -> None:
        self.spec = spec
        self.name = spec.name
        self.arn = spec.arn
        self.python = python
        self.max_concurrency = max_concurrency
        self.init_timeout = init_timeout
        self._log = open(spec.log_file, "ab", buffering=0) if spec.log_file else None
        self._idle: queue.Queue[_Environment] = queue.Queue()
        self._environments: set[_Environment] = set()
        self._lock = threading.Lock()
        # Set by begin_stop: no environment starts after it, and a waiting invocation gives up.
        self._stopped = False
        self._first = self._start_environment()

    def _start_environment(self) -> _Environment:
        environment = _Environment(self.spec, self.python, self._log)
        with self._lock:
            self._environments.add(environment)
        return environment

    def _await_init(self, environment: _Environment) -> _Environment:
        ready = environment.read(self.init_timeout)
        if ready is None:
            self._retire(environment)
            raise FunctionError(
                self.name,
                {"errorType": "Runtime.InitTimeout", "errorMessage": f"no init within {self.init_timeout}s"},
            )
        environment.init_error = ready.get("init_error")
        return environment

    def wait_ready(self) -> None:
        """Block until the first environment has imported its handler (the cold start is paid here)."""
        self._idle.put(self._await_init(self._first))

    @property
    def init_error(self) -> dict[str, Any] | None:
        """The first environment's init failure (a missing module, a crash at import), if any."""
        return self._first.init_error

    def _retire(self, environment: _Environment) -> None:
        environment.kill()
        with self._lock:
            self._environments.discard(environment)

    def _acquire(self) -> _Environment:
        try:
            return self._idle.get_nowait()
        except queue.Empty:
            pass
        self._grow()
        while True:
            try:
                return self._idle.get(timeout=_GROW_CHECK_SEC)
            except queue.Empty:
                if self._stopped:
                    raise FunctionError(
                        self.name, {"errorType": "Runtime.Stopped", "errorMessage": "the local stack stopped"}
                    ) from None
                # An environment retired meanwhile (timed out, died, never ready) leaves room: every
                # waiting invocation would otherwise wait for ones that will never come back.
                self._grow()

    def _grow(self) -> None:
        """Start one more environment, if there is room, that joins the idle ones once ready."""
        with self._lock:  # checked and counted at once: invocations waiting together stay within the limit
            if self._stopped or len(self._environments) >= self.max_concurrency:
                return
            environment = _Environment(self.spec, self.python, self._log)
            self._environments.add(environment)
        threading.Thread(
            target=self._join_when_ready, args=(environment,), name=f"{self.name}-init", daemon=True
        ).start()

    def _join_when_ready(self, environment: _Environment) -> None:
        try:
            ready = self._await_init(environment)
        except (FunctionError, OSError, ValueError):
            return  # never ready (retired), or the stack stopped meanwhile (killed)
        with self._lock:
            stopped = self._stopped or environment not in self._environments
        if stopped:
            environment.kill()
        else:
            self._idle.put(ready)

    def invoke(self, event: dict[str, Any]) -> Any:
        environment = self._acquire()
        request_id = str(uuid.uuid4())
        deadline = time.time() + self.spec.timeout_sec
        try:
            environment.send(
                {
                    "event": event,
                    "deadline_ms": int(deadline * 1000),
                    "trace_id": trace_header(),
                    "context": {
                        "function_name": self.spec.name,
                        "memory_limit_in_mb": self.spec.memory_mb,
                        "invoked_function_arn": self.spec.arn,
                        "aws_request_id": request_id,
                        "log_group_name": f"/aws/lambda/{self.spec.name}",
                    },
                }
            )
            answer = environment.read(deadline - time.time())
        except (BrokenPipeError, OSError, ValueError):
            answer = None
        if answer is None:
            alive = environment.process.poll() is None
            self._retire(environment)
            if alive:  # Lambda stops the environment at the function's timeout
                error = {
                    "errorType": "Sandbox.Timedout",
                    "errorMessage": f"{request_id} Task timed out after {self.spec.timeout_sec:.2f} seconds",
                }
            else:
                error = {
                    "errorType": "Runtime.ExitError",
                    "errorMessage": f"RequestId: {request_id} Error: Runtime exited with error: exit status "
                    f"{environment.process.returncode}",
                }
            if self._log and not self._log.closed:  # (closed: the stack stopped, killing it)
                self._log.write(f"[ERROR] {error['errorType']}: {error['errorMessage']}\n".encode())
            raise FunctionError(self.name, error)
        self._idle.put(environment)
        if "error" in answer:
            raise FunctionError(self.name, answer["error"])
        return answer["ok"]

    def stop(self, grace_sec: float = 2) -> None:
        self.finish_stop(self.begin_stop(), time.monotonic() + grace_sec)

    def begin_stop(self) -> list[_Environment]:
        """Tell every idle environment its input ended and kill the busy ones; the idle ones are
        returned for finish_stop. A stack stops all its functions' environments at once this way,
        so one grace period is shared instead of paid once per environment (a stack of 16
        functions with up to 4 environments each took over a minute to stop on a busy machine)."""
        with self._lock:
            self._stopped = True
        idle: list[_Environment] = []
        while True:
            try:
                idle.append(self._idle.get_nowait())
            except queue.Empty:
                break
        for environment in idle:
            environment.end_input()
        with self._lock:
            others, self._environments = self._environments - set(idle), set()
        for environment in others:  # still in an invocation, or never idle
            environment.kill()
        return idle

    def finish_stop(self, idle: list[_Environment], deadline: float) -> None:
        for environment in idle:
            environment.close(deadline)
        if self._log:
            self._log.close()


class TraceDaemonSocket:
    """The UDP address Lambda's X-Ray daemon listens on, held by the stack so the tracer's segments
    have somewhere to go (nothing answers them, as nothing answers on AWS: the SDK only sends).
    Segments queue in the socket's buffer and are dropped once it is full; a test can read them."""

    def __init__(self) -> None:
        import socket

        self._socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._socket.bind(("127.0.0.1", 0))
        self._socket.setblocking(False)
        host, port = self._socket.getsockname()
        self.address = f"{host}:{port}"

    def environment(self) -> dict[str, str]:
        host, port = self.address.split(":")
        return {
            "AWS_XRAY_DAEMON_ADDRESS": self.address,
            "_AWS_XRAY_DAEMON_ADDRESS": host,
            "_AWS_XRAY_DAEMON_PORT": port,
        }

    def segments(self) -> list[dict[str, Any]]:
        """The segment documents received so far (each datagram: a JSON header line, then the segment)."""
        found: list[dict[str, Any]] = []
        while True:
            try:
                datagram = self._socket.recv(65536)
            except BlockingIOError:
                return found
            _, _, document = datagram.decode().partition("\n")
            found.append(json.loads(document))

    def close(self) -> None:
        self._socket.close()
