"""The runtime loop of one local Lambda execution environment (standard library only).

Started by `lambda_runtime.FunctionRuntime` as `python3.12 -I -S lambda_bootstrap.py ...`: no site
packages, no PYTHON* variables, no directory of this file on sys.path. sys.path is exactly what
Lambda gives a function: its code (LAMBDA_TASK_ROOT), its layers (/opt/python) and the runtime's
own packages, then the standard library. Requests and answers are JSON lines on two pipes, so the
function's own stdout and stderr (its logs) stay free, as in Lambda.
"""

import argparse
import importlib
import json
import math
import os
import resource
import sys
import time
import traceback


class LambdaContext:
    """The context object Lambda hands a Python handler (the attributes it documents)."""

    def __init__(self, fields, deadline_ms):
        self.function_name = fields["function_name"]
        self.function_version = fields.get("function_version", "$LATEST")
        self.invoked_function_arn = fields["invoked_function_arn"]
        self.memory_limit_in_mb = int(fields["memory_limit_in_mb"])
        self.aws_request_id = fields["aws_request_id"]
        self.log_group_name = fields.get("log_group_name", "")
        self.log_stream_name = fields.get("log_stream_name", "")
        self.identity = None
        self.client_context = None
        self._deadline_ms = deadline_ms

    def get_remaining_time_in_millis(self):
        return max(0, int(self._deadline_ms - time.time() * 1000))


def _error(exc, error_type=None):
    return {
        "errorMessage": str(exc),
        "errorType": error_type or type(exc).__name__,
        "stackTrace": traceback.format_exception(type(exc), exc, exc.__traceback__),
    }


def _report(context, started, init_ms):
    """The line Lambda writes after each invocation ("REPORT RequestId: ...\tDuration: ..."), with
    Init Duration on an environment's first: what a slow claim or heartbeat is read from."""
    duration = (time.monotonic() - started) * 1000
    used_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024  # Linux: KiB
    line = (
        f"REPORT RequestId: {context.aws_request_id}\tDuration: {duration:.2f} ms\t"
        f"Billed Duration: {math.ceil(duration)} ms\tMemory Size: {context.memory_limit_in_mb} MB\t"
        f"Max Memory Used: {used_mb} MB\t"
    )
    if init_ms is not None:
        line += f"Init Duration: {init_ms:.2f} ms\t"
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main():
    init_started = time.monotonic()
    parser = argparse.ArgumentParser()
    parser.add_argument("--request-fd", type=int, required=True)
    parser.add_argument("--response-fd", type=int, required=True)
    parser.add_argument("--handler", required=True)
    parser.add_argument("--path", action="append", default=[])
    args = parser.parse_args()
    sys.path[:0] = args.path
    requests = os.fdopen(args.request_fd, "r", encoding="utf-8")
    responses = os.fdopen(args.response_fd, "w", encoding="utf-8")

    def answer(message):
        responses.write(json.dumps(message) + "\n")
        responses.flush()

    module_name, function_name = args.handler.rsplit(".", 1)
    init_error = None
    try:
        entry = getattr(importlib.import_module(module_name), function_name)
    except Exception as exc:  # Lambda answers every invocation with the init failure
        kind = (
            "Runtime.ImportModuleError"
            if isinstance(exc, ImportError)
            else "Runtime.HandlerNotFound"
            if isinstance(exc, AttributeError)
            else None
        )
        init_error = _error(exc, kind)
        init_error["errorMessage"] = f"Unable to import module '{module_name}': {exc}"
        sys.stderr.write(f"[ERROR] {init_error['errorType']}: {init_error['errorMessage']}\n")
        sys.stderr.flush()
    # Said once, on the first invocation's REPORT, as Lambda does.
    init_ms: float | None = (time.monotonic() - init_started) * 1000
    answer({"ready": True, "init_error": init_error})

    for line in requests:
        request = json.loads(line)
        context = LambdaContext(request["context"], request["deadline_ms"])
        os.environ["_X_AMZN_TRACE_ID"] = request["trace_id"]
        sys.stdout.write(f"START RequestId: {context.aws_request_id} Version: {context.function_version}\n")
        sys.stdout.flush()
        started = time.monotonic()
        try:
            if init_error is not None:
                answer({"error": init_error})
                continue
            try:
                result = entry(request["event"], context)
            except Exception as exc:  # the invocation's error answer, as Lambda reports it
                error = _error(exc)
                sys.stderr.write(
                    f"[ERROR] {error['errorType']}: {error['errorMessage']}\n{''.join(error['stackTrace'])}"
                )
                sys.stderr.flush()
                answer({"error": error})
                continue
            try:
                encoded = json.dumps({"ok": result})
            except (TypeError, ValueError) as exc:  # Lambda cannot serialize the answer either
                answer({"error": _error(exc, "Runtime.MarshalError")})
                continue
            sys.stdout.write(f"END RequestId: {context.aws_request_id}\n")
            sys.stdout.flush()
            responses.write(encoded + "\n")
            responses.flush()
        finally:
            _report(context, started, init_ms)
            init_ms = None


if __name__ == "__main__":
    main()
