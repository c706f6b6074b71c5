"""Fixtures of the console's browser tests: one headless Chromium per module, and a local stack
(`relevo local up` as a process) with regions of its own and a real relevo-agent in each, started
once per test worker (about 20 CPU-s with its agents) and shared by the modules and groups that ask
for it: each test makes its own projects and jobs."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import ExitStack

import pytest

from relevo_cli.api import RelevoApi
from relevo_core.aws import reset_clients
from relevo_core.files.stack import StackInfo
from relevo_local.processes import agent_process, local_stack, write_agent_config
from tests.helpers.browser import CHROMIUM_MISSING, chromium_path, no_chromium_verdict
from tests.helpers.stack import use_stack

CONSOLE_REGION = "console"
# A region of its own for the agent that masks a secret: the agent holds back the last
# len(secret) - 1 characters it read (they may start a secret), which other tests' output, short
# lines followed by silence, would then wait behind.
MASKING_REGION = "console-masking"
# A secret in that agent's environment that its `mask` names: stages can print it, logs never hold it.
SECRET_VARIABLE = "RELEVO_CONSOLE_SECRET"
SECRET_VALUE = f"s3cr3t-{secrets.token_hex(8)}"
# The console agent's artifact uploads are capped at this (each file): a few files of some
# hundred KiB take seconds, so a page can watch an upload under way. The other tests' files are
# a few KiB.
UPLOAD_BYTES_PER_SEC = 128 * 1024


# Module scope: Playwright's sync API runs an event loop in this thread while it is started, and
# a later test of the same worker calling asyncio.run() would find it running.
@pytest.fixture(scope="module")
def chromium() -> Iterator[Browser]:  # noqa: F821
    path = chromium_path()
    if path is None:
        if no_chromium_verdict() == "fail":
            pytest.fail(CHROMIUM_MISSING)
        pytest.skip(CHROMIUM_MISSING)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=path, headless=True, args=["--no-sandbox"])
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture(scope="session")
def console_stack_running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StackInfo]:
    """A stack of two regions of its own, no other test's work reaches them: one agent (capacity
    2) in the console's region, and one that masks a secret in the masking region. It does not
    point this process at itself (console_stack does, for a module's life)."""
    state_dir = tmp_path_factory.mktemp("console-stack")
    with local_stack(
        state_dir,
        state_dir / "local-up.log",
        ["--region-affinities", f"{CONSOLE_REGION},{MASKING_REGION}"],
    ) as info:
        config = write_agent_config(
            state_dir / "agent.toml",
            state_dir / "stack.json",
            CONSOLE_REGION,
            "console-mac",
            capacity=2,
            poll_wait_sec=1,
            presence_interval_sec=1,
            outbox_interval_sec=0.2,
            artifact_upload_max_bandwidth=UPLOAD_BYTES_PER_SEC,
        )
        masking = write_agent_config(
            state_dir / "masking-agent.toml",
            state_dir / "stack.json",
            MASKING_REGION,
            "console-masking-mac",
            poll_wait_sec=1,
            presence_interval_sec=1,
            outbox_interval_sec=0.2,
        )
        with masking.open("a") as toml:
            toml.write(f'mask = ["{SECRET_VARIABLE}"]\n')
        with ExitStack() as agents:
            # The agents start in the stack's environment, as a module's would; the process itself
            # is pointed at the stack by console_stack alone.
            with pytest.MonkeyPatch.context() as patch:
                use_stack(patch, info)
                agents.enter_context(agent_process(config, state_dir / "agent.log"))
                agents.enter_context(
                    agent_process(
                        masking, state_dir / "masking-agent.log", env={SECRET_VARIABLE: SECRET_VALUE}
                    )
                )
            reset_clients()
            yield info


@pytest.fixture(scope="module")
def console_stack(console_stack_running: StackInfo) -> Iterator[StackInfo]:
    """The worker's console stack, this process pointed at it for the module's life."""
    with pytest.MonkeyPatch.context() as patch:
        use_stack(patch, console_stack_running)
        yield console_stack_running
    reset_clients()


@pytest.fixture(scope="module")
def operator_api(console_stack: StackInfo) -> RelevoApi:
    return RelevoApi.for_stack(console_stack)


@pytest.fixture()
def browser_page(chromium) -> Iterator[Page]:  # noqa: F821
    context = chromium.new_context(accept_downloads=True, viewport={"width": 1280, "height": 1000})
    page = context.new_page()
    try:
        yield page
    finally:
        context.close()
