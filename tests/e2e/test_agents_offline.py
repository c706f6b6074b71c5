"""agents_offline with real relevo-agent processes on `relevo local up` (issue 19): a region whose
last agent is SIGKILLed (it never writes `online: false`) pages each group with a project there
once, from the sweeper's recorded change of the region; the agent coming back and being killed
again inside the 10-minute window pages nobody; a clean stop still pages once, although the
sweep after it records the same change. The groups' Slack channels post to a local recorder;
the sweeps are the sweeper function's handler run here against the stack, with its deployed
environment (the stack's own minute timer may sweep too: the record is written once either way)."""

from __future__ import annotations

import os
import secrets
import signal
import time
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from relevo_cli.api import RelevoApi
from relevo_core.aws import client
from relevo_core.config.sweeper import sweeper_settings
from relevo_core.files.stack import StackInfo
from relevo_core.models.group import Group
from relevo_core.store import agents
from relevo_core.store.groups import put_group
from relevo_local.processes import agent_process, write_agent_config
from tests.helpers.stack import LambdaContext, load_handler, regions_of, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300), pytest.mark.xdist_group("e2e-agents-offline")]

REGIONS = ("lost", "stopped")
PRESENCE_SEC = 0.5  # an agent that stopped writing is offline 1.5 s later (ONLINE_MULTIPLE x interval)
OFFLINE_TITLE = "no agent online in {region}"


@pytest.fixture(scope="module")
def stack(shared_stack: tuple[StackInfo, Path]) -> Iterator[tuple[StackInfo, Path]]:
    with regions_of(shared_stack, REGIONS) as stack:
        yield stack


@pytest.fixture()
def sweep(stack, monkeypatch):
    """One sweep of the sweeper function, as deployed (its environment read off the stack)."""
    info, _ = stack
    deployed = client("lambda").get_function_configuration(FunctionName=info.resources["SweeperFunction"])
    for name, value in deployed["Environment"]["Variables"].items():
        if not name.startswith("AWS_"):
            monkeypatch.setenv(name, str(value))
    # The worker's shared Metrics object may have been built (without a namespace) by an earlier
    # test: it takes the deployed one, as the function's own would at its cold start.
    from relevo_core.observability import metrics

    monkeypatch.setattr(
        metrics, "namespace", deployed["Environment"]["Variables"]["POWERTOOLS_METRICS_NAMESPACE"]
    )
    sweeper_settings.cache_clear()
    handler = load_handler("sweeper")
    yield lambda: handler({}, LambdaContext("SweeperFunction"))
    sweeper_settings.cache_clear()


def _groups(info: StackInfo, recorder, region: str, count: int) -> list[str]:
    """`count` groups, each with a Slack channel (its own webhook path on the recorder) and a
    project in `region`; returns each group's webhook path."""
    paths = []
    api = RelevoApi.for_stack(info)
    for _ in range(count):
        name = "g-" + secrets.token_hex(4)
        path = f"/services/T0/B0/{secrets.token_hex(12)}"
        ref = f"relevo/{info.stack_name}/_notify/{name}/slack"
        client("secretsmanager").create_secret(Name=ref, SecretString=recorder.url + path)
        put_group(
            info.table_name,
            Group.model_validate(
                {
                    "name": name,
                    "events": ["agents_offline"],
                    "channels": [{"kind": "slack", "webhook_secret_ref": ref}],
                }
            ),
            "test",
            datetime.now(UTC),
        )
        project_id = f"{region}-{secrets.token_hex(3)}"
        api.put_project(
            project_id,
            {
                "repo": f"acme/{project_id}",
                "region_affinity": region,
                "group": name,
                "stages": [{"name": "build", "run": "make"}],
            },
        )
        paths.append(path)
    return paths


def _pages(recorder, path: str, region: str) -> int:
    return sum(1 for r in recorder.received(path) if r.json()["text"] == OFFLINE_TITLE.format(region=region))


def _online(info: StackInfo, region: str) -> list[str]:
    return [a.agent_id for a in agents.online_agents(info.table_name, region, datetime.now(UTC))]


def _start(
    running: ExitStack, info: StackInfo, tmp_path: Path, stack_file: Path, region: str, agent_id: str
) -> Any:
    config = write_agent_config(
        tmp_path / f"{agent_id}.toml",
        stack_file,
        region,
        agent_id,
        poll_wait_sec=1,
        presence_interval_sec=PRESENCE_SEC,
    )
    process = running.enter_context(agent_process(config, tmp_path / f"{agent_id}.log"))
    wait_until(lambda: agent_id in _online(info, region), 30, f"{agent_id} online")
    return process


def _settled() -> None:
    """Anything the reporter was going to post has come by now: the local stack reads the stream
    every 0.5 s, and the reporter posts to a loopback recorder."""
    time.sleep(2)


def test_a_region_whose_last_agent_is_killed_pages_each_group_once_and_a_flap_in_the_window_pages_nobody(
    stack, sweep, recorder, tmp_path: Path
):
    info, stack_file = stack
    region = "lost"
    hooks = _groups(info, recorder, region, 2)
    agent_id = "mac-" + secrets.token_hex(3)
    with ExitStack() as running:
        mac = _start(running, info, tmp_path, stack_file, region, agent_id)
        sweep()  # the region has an agent online
        os.kill(mac.pid, signal.SIGKILL)  # no clean stop: its record still says online, until it ages out
        wait_until(lambda: not _online(info, region), 10, "the killed agent's presence timing out")
        sweep()
        sweep()  # a second sweep sees the same fleet: it records nothing
        for hook in hooks:
            wait_until(lambda hook=hook: _pages(recorder, hook, region) >= 1, 20, "the agents_offline page")
        _settled()
        assert [_pages(recorder, hook, region) for hook in hooks] == [1, 1]

        # Back a few seconds later (launchd restarts it), then killed again: the same outage.
        mac = _start(running, info, tmp_path, stack_file, region, agent_id)
        sweep()
        os.kill(mac.pid, signal.SIGKILL)
        wait_until(lambda: not _online(info, region), 10, "the killed agent's presence timing out")
        sweep()
        _settled()
        assert [_pages(recorder, hook, region) for hook in hooks] == [1, 1]

    [message] = recorder.received(hooks[0])
    assert "relevo agent list" in message.body.decode()


def test_a_clean_stop_still_pages_once_although_the_sweep_records_the_same_change(
    stack, sweep, recorder, tmp_path: Path
):
    info, stack_file = stack
    region = "stopped"
    [hook] = _groups(info, recorder, region, 1)
    agent_id = "mac-" + secrets.token_hex(3)
    with ExitStack() as running:
        mac = _start(running, info, tmp_path, stack_file, region, agent_id)
        sweep()
        mac.send_signal(signal.SIGTERM)  # a clean stop: the agent marks itself offline
        mac.wait(timeout=30)
        wait_until(
            lambda: _pages(recorder, hook, region) >= 1, 20, "the agents_offline page of the clean stop"
        )
        sweep()  # records the region's change to none online: the reporter hears it inside the window
        _settled()
    assert _pages(recorder, hook, region) == 1
