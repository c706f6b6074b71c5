"""The layer that ships, imported with nothing else.

`sam build` makes the core layer from `layers/core/requirements.txt` plus `relevo_core`; Lambda
then imports each function with its code, that layer and the runtime's boto3, nothing more. A
dependency the development virtualenv has and the layer lacks (the X-Ray SDK that Powertools'
Tracer imports, once) passes every test run from that virtualenv and fails every cold start on
AWS. These tests build the layer the way the local stack does (lambda_layer) and start each
function under the runtime's Python in isolated mode (lambda_runtime), as the stack runs them.
"""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path

import pytest

from relevo_local import lambda_layer, template
from relevo_local.lambda_runtime import FunctionError, FunctionRuntime, FunctionSpec
from tests.helpers.processes import is_dead
from tests.helpers.stack import wait_until

ROOT = Path(__file__).resolve().parents[2]
SAM = template.load_sam_template(ROOT / "template.yaml")
RUNTIME = SAM["Globals"]["Function"]["Runtime"]


@pytest.fixture(scope="module")
def python() -> lambda_layer.LambdaPython:
    return lambda_layer.find_lambda_python(RUNTIME)


@pytest.fixture(scope="module")
def built(python: lambda_layer.LambdaPython, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    layer = lambda_layer.build_layer(
        ROOT / "layers/core", python, tmp_path_factory.mktemp("build") / "CoreLayer"
    )
    return layer, lambda_layer.runtime_packages(python)


def _spec(name: str, code_dir: Path, handler: str, built: tuple[Path, Path], log: Path) -> FunctionSpec:
    layer, runtime = built
    return FunctionSpec(
        name=name,
        arn=f"arn:aws:lambda:us-east-1:123456789012:function:{name}",
        code_dir=code_dir,
        layer_dirs=[layer],
        runtime_dir=runtime,
        handler=handler,
        # Lambda sets both region variables in every environment (Lambda Developer Guide, "Defined
        # runtime environment variables": AWS_REGION, AWS_DEFAULT_REGION); boto3 reads the second,
        # and a function that builds its clients at init (the claim route's) needs it there.
        environment={
            "TABLE_NAME": "relevo-Table",
            "POWERTOOLS_SERVICE_NAME": "relevo",
            "AWS_REGION": "us-east-1",
            "AWS_DEFAULT_REGION": "us-east-1",
        },
        timeout_sec=10,
        log_file=log,
    )


@pytest.mark.parametrize("function", template.sam_functions(SAM, ROOT), ids=lambda fn: fn.logical_id)
def test_each_function_starts_with_only_its_code_the_built_layer_and_the_runtime_boto3(
    function: template.SamFunction,
    python: lambda_layer.LambdaPython,
    built: tuple[Path, Path],
    tmp_path: Path,
) -> None:
    log = tmp_path / "function.log"
    runtime = FunctionRuntime(
        _spec(function.logical_id, function.code_dir, function.handler, built, log), python
    )
    try:
        runtime.wait_ready()
        assert runtime.init_error is None, (
            f"{function.logical_id} fails at cold start on {python.executable} with only its code, the "
            "layer and "
            f"the runtime's boto3: {runtime.init_error['errorMessage']}\n{log.read_text()}"
        )
    finally:
        runtime.stop()


PROBE = """
import sys, aws_xray_sdk, pydantic_core, relevo_core, boto3, botocore
def lambda_handler(event, context):
    return {
        "path": sys.path,
        "modules": {
            m.__name__: m.__file__ for m in (aws_xray_sdk, pydantic_core, relevo_core, boto3, botocore)
        },
        "version": list(sys.version_info[:2]),
        "no_site": "site" not in sys.modules,
        "remaining_ms": context.get_remaining_time_in_millis(),
    }
"""


def test_a_function_sees_only_its_code_the_layer_the_runtime_and_the_standard_library(
    python: lambda_layer.LambdaPython, built: tuple[Path, Path], tmp_path: Path
) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "handler.py").write_text(PROBE)
    layer, runtime_dir = built
    runtime = FunctionRuntime(
        _spec("probe", code, "handler.lambda_handler", built, tmp_path / "probe.log"), python
    )
    try:
        runtime.wait_ready()
        seen = runtime.invoke({})
    finally:
        runtime.stop()
    stdlib = Path(python.executable).resolve().parents[1]
    for entry in seen["path"]:
        assert entry in (str(code), str(layer), str(runtime_dir)) or Path(entry).resolve().is_relative_to(
            stdlib
        ), entry
        assert "site-packages" not in entry or Path(entry).resolve().is_relative_to(stdlib), entry
    assert seen["no_site"]
    assert Path(seen["modules"]["aws_xray_sdk"]).is_relative_to(layer)
    assert Path(seen["modules"]["relevo_core"]).is_relative_to(layer)
    # The layer pins boto3 and botocore (see layers/core/requirements.txt), ahead of the runtime's.
    assert Path(seen["modules"]["botocore"]).is_relative_to(layer)
    assert seen["version"] == list(python.version)
    assert 0 < seen["remaining_ms"] <= 10_000


def test_the_runtime_python_is_the_lambda_runtime_version_where_this_machine_has_one(
    python: lambda_layer.LambdaPython,
) -> None:
    wanted = tuple(int(part) for part in RUNTIME.removeprefix("python").split("."))
    if not python.matches_runtime:
        pytest.skip(
            f"no Python {RUNTIME.removeprefix('python')} on this machine (PATH or pyenv); the host's "
            f"{python.tag} stands in"
        )
    assert python.version == wanted


def test_a_handler_that_fails_or_runs_past_its_timeout_answers_as_lambda_does(
    python: lambda_layer.LambdaPython, built: tuple[Path, Path], tmp_path: Path
) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "handler.py").write_text(
        "import time\n"
        "def lambda_handler(event, context):\n"
        "    if event.get('sleep'):\n"
        "        time.sleep(event['sleep'])\n"
        "    if event.get('raise'):\n"
        "        raise ValueError('refused')\n"
        "    return {'set': object()} if event.get('unserializable') else {'ok': True}\n"
    )
    spec = _spec("failing", code, "handler.lambda_handler", built, tmp_path / "failing.log")
    spec.timeout_sec = 1.0
    runtime = FunctionRuntime(spec, python)
    try:
        runtime.wait_ready()
        with pytest.raises(FunctionError) as raised:
            runtime.invoke({"raise": True})
        assert raised.value.error["errorType"] == "ValueError"
        with pytest.raises(FunctionError) as marshal:
            runtime.invoke({"unserializable": True})
        assert marshal.value.error["errorType"] == "Runtime.MarshalError"
        with pytest.raises(FunctionError) as timed_out:
            runtime.invoke({"sleep": 5})
        assert re.search(r"Task timed out after 1\.00 seconds", timed_out.value.error["errorMessage"])
        # The timed-out environment is gone; the next invocation gets a fresh one.
        assert runtime.invoke({}) == {"ok": True}
    finally:
        runtime.stop()


def _pins(lines: list[str]) -> dict[str, str]:
    pins = {}
    for line in lines:
        name, _, version = line.partition("==")
        pins[re.sub(r"\[.*\]", "", name).lower().replace("_", "-")] = version.strip()
    return pins


def test_the_layer_pins_every_package_it_installs_at_the_version_the_dev_lock_tests(
    built: tuple[Path, Path],
) -> None:
    requirements = lambda_layer.requirement_lines(ROOT / "layers/core/requirements.txt")
    assert all("==" in line for line in requirements), [line for line in requirements if "==" not in line]
    pinned = _pins(requirements)
    locked = _pins(
        [
            line
            for line in (ROOT / "requirements/dev.lock").read_text().splitlines()
            if "==" in line and not line.startswith(" ")
        ]
    )
    assert {name: version for name, version in pinned.items() if locked.get(name) != version} == {}
    layer, _ = built
    installed = {
        re.sub(r"-[^-]+\.dist-info$", "", path.name).lower().replace("_", "-"): re.search(
            r"-([^-]+)\.dist-info$", path.name
        ).group(1)
        for path in layer.glob("*.dist-info")
    }
    # The closure pip resolved is exactly the pinned list: nothing arrives unpinned.
    assert installed == pinned


def test_an_invocation_that_finds_every_environment_busy_takes_the_first_one_free(
    python: lambda_layer.LambdaPython, built: tuple[Path, Path], tmp_path: Path
) -> None:
    # Given a function whose environments after the first stay in their cold start, and whose
    # invocation holds until the test writes to a FIFO
    spec, hold, cold = _cold_after_the_first(built, tmp_path)
    runtime = FunctionRuntime(spec, python)
    answers: dict[str, int] = {}
    try:
        runtime.wait_ready()
        held = threading.Thread(target=lambda: answers.update(held=runtime.invoke({"hold": str(hold)})))
        held.start()
        # When a second invocation comes while the only warm environment is busy, so that a second
        # environment starts its cold start, and the first invocation then ends
        second = threading.Thread(target=lambda: answers.update(second=runtime.invoke({})))
        second.start()
        wait_until(cold.exists, 60, "a second environment in its cold start")
        with open(hold, "w") as release:
            release.write("go")
        held.join(30)
        second.join(30)

        # Then the second ran in the warm environment that came free, not after the cold start
        assert not second.is_alive(), "the second invocation waits for the new environment's cold start"
        assert answers["second"] == answers["held"]
    finally:
        runtime.stop()  # (the environment still in its cold start is killed)
    # And each invocation is reported as Lambda reports it, the first with its environment's init
    reports = [
        line for line in (tmp_path / "scaling.log").read_text().splitlines() if line.startswith("REPORT")
    ]
    assert len(reports) == 2, reports
    assert all(
        re.search(
            r"\tDuration: [\d.]+ ms\tBilled Duration: \d+ ms\tMemory Size: 512 MB\tMax Memory Used: \d+ MB", r
        )
        for r in reports
    ), reports
    assert ["Init Duration: " in report for report in reports] == [True, False], reports


@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
def test_an_invocation_waiting_for_an_environment_gives_up_when_the_stack_stops(
    python: lambda_layer.LambdaPython, built: tuple[Path, Path], tmp_path: Path
) -> None:
    # Given every environment busy or in its cold start, and an invocation waiting for one
    spec, hold, cold = _cold_after_the_first(built, tmp_path)
    spec.timeout_sec = 60.0
    runtime = FunctionRuntime(spec, python, max_concurrency=2)
    runtime.wait_ready()
    errors: dict[str, FunctionError] = {}

    def invoke(name: str, event: dict[str, str]) -> None:
        try:
            runtime.invoke(event)
        except FunctionError as error:
            errors[name] = error

    held = threading.Thread(target=invoke, args=("held", {"hold": str(hold)}))
    held.start()
    waiting = threading.Thread(target=invoke, args=("waiting", {}))
    waiting.start()
    wait_until(cold.exists, 60, "a second environment in its cold start")
    pids = {int(line) for line in (tmp_path / "pids").read_text().split()}
    assert len(pids) == 2

    # When the stack stops
    runtime.stop()

    # Then the waiting invocation says so, and no environment is left: none started after the stop
    waiting.join(30)
    held.join(30)
    assert errors["waiting"].error["errorType"] == "Runtime.Stopped"
    # and the one killed in its invocation answers with an error (not a write to the closed log)
    assert "held" in errors
    assert {int(line) for line in (tmp_path / "pids").read_text().split()} == pids
    assert [pid for pid in pids if not is_dead(pid)] == []


def _cold_after_the_first(built: tuple[Path, Path], tmp_path: Path) -> tuple[FunctionSpec, Path, Path]:
    """A function whose environments write their pid, and after the first, say they are in their
    cold start (the file `cold`) and stay in it (opening a FIFO nobody writes to); its invocation
    returns its pid, holding first until the test writes to the FIFO `hold` when the event names it."""
    code = tmp_path / "code"
    code.mkdir()
    never, hold, cold = tmp_path / "never", tmp_path / "hold", tmp_path / "cold"
    os.mkfifo(never)
    os.mkfifo(hold)
    (code / "handler.py").write_text(
        "import os\n"
        f"with open({str(tmp_path / 'pids')!r}, 'a') as pids:\n"
        "    pids.write(f'{os.getpid()}\\n')\n"
        "try:\n"
        f"    os.close(os.open({str(tmp_path / 'first')!r}, os.O_CREAT | os.O_EXCL))\n"
        "except FileExistsError:\n"
        f"    open({str(cold)!r}, 'w').close()\n"
        f"    open({str(never)!r}).read()\n"
        "def lambda_handler(event, context):\n"
        "    if event.get('hold'):\n"
        "        open(event['hold']).read()\n"
        "    return os.getpid()\n"
    )
    spec = _spec("scaling", code, "handler.lambda_handler", built, tmp_path / "scaling.log")
    spec.timeout_sec = 60.0
    return spec, hold, cold
