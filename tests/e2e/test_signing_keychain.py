"""A project's temporary signing keychain (signing.keychain: temporary, issue 20) with a real
relevo-agent on `relevo local up`: the agent reads the identities from Secrets Manager as its
region's agent role (IAM enforced), makes the keychain with the recorded `security` double
(tests/helpers/security_double.py, the agent config's security_tool), gives the stage
RELEVO_KEYCHAIN, and removes it, off the search list and deleted, when the stage succeeds, fails
or is canceled. The keychain's password is in no log and not in the job's log stream. An agent
given no security tool on Linux fails the stage Relevo.Fatal.KeychainUnsupported and runs nothing.
Nothing here ran on a Mac."""

from __future__ import annotations

import hashlib
import re
import secrets
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from relevo_cli.api import RelevoApi
from relevo_core.aws import client
from relevo_core.files.stack import StackInfo
from relevo_local.processes import agent_process, random_commit, write_agent_config
from tests.helpers import security_double
from tests.helpers.stack import regions_of, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300), pytest.mark.xdist_group("e2e-signing-keychain")]

REGIONS = ("signing", "nosign")
PASSPHRASE = 'dist pass "1"'
LOGIN = security_double.search_list(Path("/nonexistent/security"))


@pytest.fixture(scope="module")
def stack(shared_stack: tuple[StackInfo, Path]) -> Iterator[tuple[StackInfo, Path]]:
    with regions_of(shared_stack, REGIONS) as stack:
        yield stack


def _agent(
    running: ExitStack, tmp_path: Path, stack_file: Path, region: str, agent_id: str, tool: Path | None
) -> tuple[Path, Any]:
    config = tmp_path / f"{agent_id}.toml"
    if not config.exists():
        write_agent_config(
            config, stack_file, region, agent_id, capacity=2, poll_wait_sec=1, presence_interval_sec=0.5
        )
        if tool is not None:
            config.write_text(config.read_text() + f'security_tool = "{tool}"\n')
    log = tmp_path / f"{agent_id}.log"
    return log, running.enter_context(agent_process(config, log))


def _signing_project(api: RelevoApi, info: StackInfo, region: str, command: str, **stage: Any) -> str:
    project_id = f"{region}-{secrets.token_hex(3)}"
    prefix = f"relevo/{info.stack_name}/_signing/{region}/{project_id}"
    secretsmanager = client("secretsmanager")
    # A .p12 is binary: SecretBinary (the bytes here stand for one; the double does not parse them).
    secretsmanager.create_secret(Name=f"{prefix}/dist.p12", SecretBinary=b"0\x82\x0c\x1f\x02\x01\x03p12")
    secretsmanager.create_secret(Name=f"{prefix}/dist.pass", SecretString=PASSPHRASE)
    api.put_project(
        project_id,
        {
            "repo": f"acme/{project_id}",
            "region_affinity": region,
            "lease_ttl_sec": 20,
            "queue_timeout_sec": 120,
            "stages": [{"name": "sign", "run": command, **stage}],
            "signing": {
                "keychain": "temporary",
                "identities": [{"p12_ref": f"{prefix}/dist.p12", "passphrase_ref": f"{prefix}/dist.pass"}],
            },
        },
    )
    return project_id


def _run(api: RelevoApi, project_id: str) -> str:
    return api.run_project(project_id, {"ref": "main", "commit": random_commit()})["job_id"]


def _ended(api: RelevoApi, job_id: str) -> dict[str, Any]:
    return wait_until(
        lambda: (j := api.get_job(job_id))["status"] in ("succeeded", "failed", "canceled") and j,
        120,
        f"{job_id} ended",
    )


def _log_text(api: RelevoApi, job_id: str) -> str:
    return "".join(chunk["text"] for chunk in api.job_logs(job_id, from_seq=0, limit=1000)["chunks"])


def _keychains_made(tool: Path) -> list[str]:
    return [command[-1] for command in security_double.commands(tool) if command[0] == "create-keychain"]


def _assert_removed(tool: Path, keychain: str) -> None:
    assert not Path(keychain).exists(), keychain
    assert security_double.search_list(tool) == LOGIN
    assert ["delete-keychain", keychain] in security_double.commands(tool)


def _check_command(tool: Path) -> str:
    # What the stage sees: its keychain exists and is first on the user's search list.
    return (
        f'test -f "$RELEVO_KEYCHAIN" && "{tool}" list-keychains -d user | head -1 | grep -qF '
        '"$RELEVO_KEYCHAIN" && echo "keychain ok" && env'
    )


def test_the_keychain_is_made_for_the_stage_and_removed_on_success_failure_and_cancel(stack, tmp_path: Path):
    info, stack_file = stack
    api = RelevoApi.for_stack(info)
    tool = security_double.install(tmp_path / "bin")
    gate = tmp_path / "started"
    with ExitStack() as running:
        agent_log, _ = _agent(running, tmp_path, stack_file, "signing", "signing-mac", tool)

        succeeded = _run(api, _signing_project(api, info, "signing", _check_command(tool)))
        done = _ended(api, succeeded)
        assert done["status"] == "succeeded", done
        assert "keychain ok" in _log_text(api, succeeded)
        [first] = _keychains_made(tool)
        assert Path(first).name == f"{succeeded}.sign.1.keychain-db"
        _assert_removed(tool, first)

        failed = _run(
            api, _signing_project(api, info, "signing", _check_command(tool) + " >/dev/null && exit 3")
        )
        done = _ended(api, failed)
        assert done["status"] == "failed" and done["stages"][0]["error_class"] == "Relevo.Fatal.ExitCode", (
            done
        )
        second = _keychains_made(tool)[1]
        assert Path(second).name == f"{failed}.sign.1.keychain-db"
        _assert_removed(tool, second)

        canceled = _run(
            api,
            _signing_project(
                api, info, "signing", f'{_check_command(tool)} >/dev/null && touch "{gate}" && sleep 60'
            ),
        )
        wait_until(gate.exists, 60, "the canceled stage started with its keychain")
        third = _keychains_made(tool)[2]
        assert Path(third).exists() and security_double.search_list(tool)[0] == third
        api.cancel_job(canceled)
        assert _ended(api, canceled)["status"] == "canceled"
        # A cancel ends the job before the agent's stage thread removes the keychain, and the
        # double records a command once it has done it: wait for that record, not the file.
        wait_until(
            lambda: ["delete-keychain", third] in security_double.commands(tool),
            30,
            "the canceled stage's keychain deleted",
        )
        _assert_removed(tool, third)

        timed_out = _run(
            api,
            _signing_project(
                api, info, "signing", f"{_check_command(tool)} >/dev/null && sleep 60", exec_timeout_sec=2
            ),
        )
        done = _ended(api, timed_out)
        assert done["status"] == "failed" and done["stages"][0]["error_class"] == "Relevo.Timeout.Exec", done
        fourth = _keychains_made(tool)[3]
        assert Path(fourth).name == f"{timed_out}.sign.1.keychain-db"
        _assert_removed(tool, fourth)

    # One password per keychain, each only ever on the stdin of `security -i`: no log of the
    # agent, no job's log stream (which printed the stage's whole environment) holds one.
    digests = set((tool.parent / "security-state" / "secrets.json").read_text().split('"')[1::2])
    logs = agent_log.read_text() + "".join(
        _log_text(api, job) for job in (succeeded, failed, canceled, timed_out)
    )
    assert "RELEVO_KEYCHAIN=" in logs and PASSPHRASE not in logs
    candidates = set(re.findall(r"[0-9a-f]{64}", logs))
    assert not {c for c in candidates if hashlib.sha256(c.encode()).hexdigest() in digests}
    passwords = [command[2] for command in security_double.commands(tool) if command[0] == "create-keychain"]
    assert len(set(passwords)) == 4, passwords  # a fresh password per keychain
    assert not any("-p" in call["argv"] for call in security_double.calls(tool) if call["argv"] != ["-i"])


def test_an_agent_that_cannot_make_a_keychain_fails_the_stage_and_runs_nothing(stack, tmp_path: Path):
    info, stack_file = stack
    api = RelevoApi.for_stack(info)
    ran = tmp_path / "ran"
    with ExitStack() as running:
        _agent(running, tmp_path, stack_file, "nosign", "nosign-linux", None)
        job_id = _run(api, _signing_project(api, info, "nosign", f'touch "{ran}"'))
        done = _ended(api, job_id)
    assert (
        done["status"] == "failed" and done["stages"][0]["error_class"] == "Relevo.Fatal.KeychainUnsupported"
    ), done
    assert done["stages"][0]["attempt"] == 1  # fatal: not retried
    assert not ran.exists()


def test_a_keychain_a_crash_left_is_swept_when_the_agent_starts_again(stack, tmp_path: Path):
    info, stack_file = stack
    api = RelevoApi.for_stack(info)
    tool = security_double.install(tmp_path / "bin")
    gate = tmp_path / "started"
    # The first attempt waits to be killed; the retry after its lease lapsed ends at once.
    command = f'if [ -f "{gate}" ]; then echo retried; exit 0; fi; touch "{gate}"; sleep 60'
    with ExitStack() as running:
        _, crashed = _agent(running, tmp_path, stack_file, "signing", "signing-crash", tool)
        job_id = _run(api, _signing_project(api, info, "signing", command))
        wait_until(gate.exists, 60, "the first attempt started with its keychain")
        [left] = _keychains_made(tool)
        crashed.kill()  # SIGKILL: nothing of the agent runs its cleanup
        crashed.wait(timeout=10)
        assert Path(left).exists() and security_double.search_list(tool)[0] == left
        with ExitStack() as restarted:
            _agent(restarted, tmp_path, stack_file, "signing", "signing-crash", tool)
            wait_until(lambda: not Path(left).exists(), 60, "the leftover keychain swept")
            done = _ended(api, job_id)
    assert done["status"] == "succeeded", done
    commands = security_double.commands(tool)
    # Swept before the restarted agent made any keychain: off the list, then deleted.
    swept = commands.index(["delete-keychain", left])
    assert commands[swept - 2 : swept] == [
        ["list-keychains", "-d", "user"],
        ["list-keychains", "-d", "user", "-s", *LOGIN],
    ]
    assert [c[-1] for c in commands[:swept] if c[0] == "create-keychain"] == [left]
    retry = _keychains_made(tool)[1]
    assert Path(retry).name == f"{job_id}.sign.2.keychain-db"
    _assert_removed(tool, retry)


def _plain_project(api: RelevoApi, region: str, command: str) -> str:
    project_id = f"{region}-{secrets.token_hex(3)}"
    api.put_project(
        project_id,
        {
            "repo": f"acme/{project_id}",
            "region_affinity": region,
            "lease_ttl_sec": 20,
            "queue_timeout_sec": 120,
            "stages": [{"name": "build", "run": command}],
        },
    )
    return project_id


def _stays_dispatched(api: RelevoApi, job_id: str, hold_sec: float = 3.0) -> None:
    wait_until(lambda: api.get_job(job_id)["stages"][0]["status"] == "dispatched", 30, f"{job_id} dispatched")
    deadline = time.monotonic() + hold_sec
    while time.monotonic() < deadline:
        assert api.get_job(job_id)["stages"][0]["status"] == "dispatched"
        time.sleep(0.2)


def test_a_signing_stage_runs_alone_on_its_agent(stack, tmp_path: Path):
    """The search list is the user's: while a stage with a keychain runs, no other stage of the
    agent does, and it waits for the stages running there (capacity 2 notwithstanding)."""
    info, stack_file = stack
    api = RelevoApi.for_stack(info)
    tool = security_double.install(tmp_path / "bin")
    started, release = tmp_path / "started", tmp_path / "release"
    gated = f'touch "{started}"; while [ ! -f "{release}" ]; do sleep 0.1; done'
    with ExitStack() as running:
        agent_log, _ = _agent(running, tmp_path, stack_file, "signing", "signing-alone", tool)
        plain = _run(api, _plain_project(api, "signing", gated))
        wait_until(started.exists, 60, "the plain stage started")
        signed = _run(api, _signing_project(api, info, "signing", "echo signed"))
        _stays_dispatched(api, signed)
        assert _keychains_made(tool) == []
        release.touch()
        assert _ended(api, plain)["status"] == "succeeded" and _ended(api, signed)["status"] == "succeeded"

        started.unlink()
        release.unlink()
        signing = _run(api, _signing_project(api, info, "signing", gated))
        wait_until(started.exists, 60, "the signing stage started")
        other = _run(api, _plain_project(api, "signing", "echo built"))
        _stays_dispatched(api, other)
        release.touch()
        assert _ended(api, signing)["status"] == "succeeded" and _ended(api, other)["status"] == "succeeded"
    log = agent_log.read_text()
    assert (
        "a signing stage runs alone and others run here" in log and "a signing stage runs here alone" in log
    )
