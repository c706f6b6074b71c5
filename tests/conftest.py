"""Shared fixtures (helpers are in tests/helpers/). The embedded stack is real moto in server mode with
template.yaml deployed,
started once per test worker; tests isolate themselves by project id and job id."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator

import pytest

from tests.helpers import TEST_ADMIN_ARN

# Nothing in the suite may reach a real AWS account.
os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
os.environ.pop("AWS_PROFILE", None)
# Nor read this machine's ~/.aws: the suite's credentials come from the stacks it starts.
os.environ["AWS_CONFIG_FILE"] = os.devnull
os.environ["AWS_SHARED_CREDENTIALS_FILE"] = os.devnull


@pytest.fixture(autouse=True)
def _environment_stays_in_its_test() -> Iterator[None]:
    """What a test changes in os.environ ends with it. The agent's CLI run in-process points the
    process at the stack it reads (a session of the agent role included): left behind, every
    later test of the worker would call AWS as that agent."""
    saved = dict(os.environ)
    yield
    if dict(os.environ) != saved:
        from relevo_core.aws import reset_clients

        os.environ.clear()
        os.environ.update(saved)
        reset_clients()


@pytest.fixture()
def wide_console(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI's one console takes its width when it is made (relevo_cli.commands.common): under
    xdist an earlier test of the worker may have made it as wide as its terminal then. A test that
    reads whole table rows widens it."""
    from relevo_cli.commands import common

    monkeypatch.setattr(common.console, "width", 250)


@pytest.fixture(scope="session")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:  # noqa: F821
    """The session's local stack itself (its role sessions, function runtimes, trace socket)."""
    from relevo_core.aws import reset_clients
    from relevo_local.stack import LocalStack

    state_dir = tmp_path_factory.mktemp("stack")
    # No timers (the sweeper minute, project schedules): tests that need a sweep or a schedule
    # firing run it themselves with their own clock.
    # Short timeouts for calls to GitHub and GitLab (a local recorder stands in for them), yet
    # long enough for a loaded 2-core CI host: at 1 s and 4 s, CI's recorder answered a retried
    # report after its reader had given up, and the report failed. (The recorder now answers from
    # a process of its own, not from the worker that also runs moto: relevo_local.recorder.)
    parameters = {
        "AdminPrincipals": TEST_ADMIN_ARN,
        "StatusHttpTimeoutSeconds": "3",
        "StatusSendBudgetSeconds": "10",
    }
    stack = LocalStack(
        state_dir=state_dir, parameters=parameters, rule_schedules=False, project_schedules=False
    )
    info = stack.start()
    # From here on the process calls the emulator as the stack's own IAM user.
    info.apply_to_environment()
    reset_clients()
    try:
        yield stack
    finally:
        stack.stop()


@pytest.fixture(scope="session")
def local_stack(emulator) -> StackInfo:  # noqa: F821
    return emulator.info


@pytest.fixture(scope="session")
def build_user() -> Iterator[BuildUser]:  # noqa: F821
    """A real OS user for `run_as`, made once per worker and removed with its home after. Making
    one needs root: skipped otherwise (CI runs as root, so there it always runs)."""
    if os.geteuid() != 0:
        pytest.skip("making an OS user needs root (CI runs as root)")
    from tests.helpers.os_users import os_user

    with os_user() as user:
        yield user


@pytest.fixture()
def shared_dir() -> Iterator[Path]:  # noqa: F821
    """A directory every user may search (tmp_path is its owner's alone), removed after."""
    from tests.helpers.os_users import searchable_directory

    with searchable_directory() as path:
        yield path


@pytest.fixture()
def project_id() -> str:
    return "p-" + secrets.token_hex(4)


@pytest.fixture(scope="session")
def intake_settings(local_stack) -> IntakeSettings:  # noqa: F821
    """The webhook function's own settings, as deployed."""
    from relevo_core.aws import client
    from relevo_core.config import IntakeSettings

    variables = client("lambda").get_function_configuration(
        FunctionName=local_stack.resources["WebhookFunction"]
    )["Environment"]["Variables"]
    return IntakeSettings.model_validate({name: str(value) for name, value in variables.items()})


@pytest.fixture()
def recorder() -> Iterator[Recorder]:  # noqa: F821
    """A local HTTP server standing in for GitHub, GitLab or Slack (tests/helpers/recorder.py)."""
    from tests.helpers.recorder import Recorder

    server = Recorder().start()
    yield server
    server.stop()


# The operator's API and a stack file naming the local stack, as the CLI reads it.
@pytest.fixture
def api(local_stack):
    from relevo_cli.api import RelevoApi

    return RelevoApi.for_stack(local_stack)


@pytest.fixture
def stack_file(local_stack, tmp_path) -> str:
    import json

    path = tmp_path / "stack.json"
    path.write_text(json.dumps(local_stack.model_dump()))
    return str(path)
