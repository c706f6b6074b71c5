"""A stage's temporary signing keychain (relevo_agent.keychain, issue 20) against the recorded double
of macOS's `security` (tests/helpers/security_double.py; its outputs: fixtures/security): the exact
command sequence, which commands carry a secret (only on the stdin of `security -i`, never in
argv), the user's search list as it was afterwards, and the cleanup of a failed creation, a failed
delete and a crash. Nothing here ran on a Mac."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import pytest

from relevo_agent.config import AgentConfig
from relevo_agent.keychain import KEYCHAIN_DIR, MAC_SECURITY, Identity, KeychainFailure, Keychains
from relevo_core.models.errors import ErrorClass
from relevo_core.models.project import Project
from tests.helpers import security_double

LOGIN = ["/Users/relevo/Library/Keychains/login.keychain-db", "/Library/Keychains/System.keychain"]
PASSPHRASE = 'p "w\\d with spaces'
TRUSTED = ["-T", "/usr/bin/codesign", "-T", "/usr/bin/security", "-T", "/usr/bin/productbuild"]


@pytest.fixture
def tool(tmp_path: Path) -> Path:
    return security_double.install(tmp_path / "bin")


def _keychains(tmp_path: Path, tool: Path | None, system: str = "Linux") -> Keychains:
    config = AgentConfig(
        region="eu-west",
        workspace_root=tmp_path / "workspaces",
        journal=tmp_path / "journal.sqlite3",
        security_tool=tool,
    )
    return Keychains(config, system=system)


def _identities(*passphrases: str) -> list[Identity]:
    return [
        Identity(f"relevo/s/_signing/eu-west/app/id{n}", b"\x30\x82p12-" + bytes([n]), p)
        for n, p in enumerate(passphrases)
    ]


def test_the_keychain_is_made_and_removed_by_this_exact_security_sequence(tmp_path: Path, tool: Path):
    keychains = _keychains(tmp_path, tool)
    path = keychains.create("job_1.sign.1", _identities(PASSPHRASE, "second"), lock_after_sec=600)
    directory = tmp_path / "workspaces" / KEYCHAIN_DIR
    k = str(directory / "job_1.sign.1.keychain-db")
    assert path == Path(k) and path.exists()
    assert security_double.search_list(tool) == [k, *LOGIN]
    assert keychains.delete(path) is True
    assert security_double.commands(tool) == [
        ["create-keychain", "-p", "<secret 1>", k],
        ["set-keychain-settings", "-lut", "900", k],
        ["unlock-keychain", "-p", "<secret 1>", k],
        [
            "import",
            str(directory / "job_1.sign.1.0.p12"),
            "-k",
            k,
            "-f",
            "pkcs12",
            "-P",
            "<secret 2>",
            *TRUSTED,
        ],
        [
            "import",
            str(directory / "job_1.sign.1.1.p12"),
            "-k",
            k,
            "-f",
            "pkcs12",
            "-P",
            "<secret 3>",
            *TRUSTED,
        ],
        ["set-key-partition-list", "-S", "apple-tool:,apple:,codesign:", "-s", "-k", "<secret 1>", k],
        ["list-keychains", "-d", "user"],
        ["list-keychains", "-d", "user", "-s", k, *LOGIN],
        # delete: off the list first (as it was), then the file
        ["list-keychains", "-d", "user"],
        ["list-keychains", "-d", "user", "-s", *LOGIN],
        ["delete-keychain", k],
    ]
    assert security_double.search_list(tool) == LOGIN and not path.exists()
    # The .p12 files lived only for their import.
    assert list(directory.iterdir()) == []


def test_secrets_go_only_through_the_stdin_of_security_i(tmp_path: Path, tool: Path):
    _keychains(tmp_path, tool).create("job_2.sign.1", _identities(PASSPHRASE), lock_after_sec=60)
    calls = security_double.calls(tool)
    interactive = [call for call in calls if call["argv"] == ["-i"]]
    # create, unlock, import, partition list: one `security -i` each, its command on stdin.
    assert [call["lines"][0][0] for call in interactive] == [
        "create-keychain",
        "unlock-keychain",
        "import",
        "set-key-partition-list",
    ]
    assert all(call["stdin"] and len(call["lines"]) == 1 for call in interactive)
    others = [call for call in calls if call["argv"] != ["-i"]]
    assert others and not any(call["stdin"] for call in others)
    assert not any(flag in call["argv"] for call in others for flag in ("-p", "-k", "-P"))
    # The passphrase reached `security` intact through its quoting (the double keeps its digest).
    digests = json.loads((tool.parent / "security-state" / "secrets.json").read_text())
    assert digests[1] == hashlib.sha256(PASSPHRASE.encode()).hexdigest()
    assert PASSPHRASE not in json.dumps(calls)


def test_a_failed_step_removes_what_was_made_and_names_no_secret(tmp_path: Path, tool: Path):
    keychains = _keychains(tmp_path, tool)
    (tool.parent / "security-state" / "keychains").mkdir(parents=True)
    (tool.parent / "security-state" / "fail").write_text("set-key-partition-list")
    with pytest.raises(KeychainFailure) as failed:
        keychains.create("job_3.sign.1", _identities(PASSPHRASE), lock_after_sec=60)
    assert failed.value.error_class is ErrorClass.KEYCHAIN_FAILED
    assert failed.value.message == (
        "security set-key-partition-list failed (exit 1): security: set-key-partition-list: The operation "
        "couldn't be completed. (injected failure)"
    )
    assert security_double.commands(tool)[-2:] == [
        ["list-keychains", "-d", "user"],
        ["delete-keychain", failed_path(tmp_path, "job_3")],
    ]
    assert security_double.search_list(tool) == LOGIN
    assert list((tmp_path / "workspaces" / KEYCHAIN_DIR).iterdir()) == []


def failed_path(tmp_path: Path, job: str) -> str:
    return str(tmp_path / "workspaces" / KEYCHAIN_DIR / f"{job}.sign.1.keychain-db")


def test_a_wrong_passphrase_fails_the_import_with_the_tools_message(tmp_path: Path, tool: Path):
    (tool.parent / "security-state" / "keychains").mkdir(parents=True)
    (tool.parent / "security-state" / "fail").write_text("import")
    with pytest.raises(KeychainFailure) as failed:
        _keychains(tmp_path, tool).create("job_4.sign.1", _identities(PASSPHRASE), lock_after_sec=60)
    assert failed.value.message.startswith(
        "signing identity relevo/s/_signing/eu-west/app/id0: security import failed (exit 1)"
    )


def test_a_failed_delete_is_logged_and_the_next_start_sweeps_it(tmp_path: Path, tool: Path, caplog):
    keychains = _keychains(tmp_path, tool)
    path = keychains.create("job_5.sign.1", _identities("x"), lock_after_sec=60)
    (tool.parent / "security-state" / "fail").write_text("delete-keychain")
    with caplog.at_level(logging.WARNING, "relevo_agent.keychain"):
        assert keychains.delete(path) is False
    assert path.exists() and security_double.search_list(tool) == LOGIN
    assert "could not delete it (security delete-keychain failed (exit 1)" in caplog.text
    assert "the agent's next start tries again" in caplog.text

    # A crash between create and delete: the keychain is still on the list, a .p12 left over.
    crashed = keychains.create("job_6.sign.1", _identities("y"), lock_after_sec=60)
    (crashed.parent / "job_6.sign.1.0.p12").write_bytes(b"left")
    (tool.parent / "security-state" / "fail").unlink()
    restarted = _keychains(tmp_path, tool)
    assert restarted.sweep() == [path, crashed]
    assert security_double.search_list(tool) == LOGIN
    assert list(crashed.parent.iterdir()) == []
    assert security_double.commands(tool)[-4:] == [
        ["list-keychains", "-d", "user"],
        ["list-keychains", "-d", "user", "-s", *LOGIN],
        ["delete-keychain", str(path)],
        ["delete-keychain", str(crashed)],
    ]


def test_an_agent_not_on_macos_without_a_security_tool_refuses(tmp_path: Path):
    with pytest.raises(KeychainFailure) as refused:
        _keychains(tmp_path, None, system="Linux").create("job_7.sign.1", _identities("x"), lock_after_sec=60)
    assert refused.value.error_class is ErrorClass.KEYCHAIN_UNSUPPORTED
    assert (
        refused.value.error_class.value == "Relevo.Fatal.KeychainUnsupported"
        and not refused.value.error_class.retryable
    )
    assert "this agent runs on Linux and was given no security_tool" in refused.value.message
    assert _keychains(tmp_path, None, system="Darwin").security.path == MAC_SECURITY
    assert _keychains(tmp_path, None, system="Linux").sweep() == []


def test_an_agent_with_run_as_refuses_before_any_security_command_or_secret(tmp_path: Path, tool: Path):
    """A keychain root makes is root's, not the build user's: no half-working signing (docs/agent.md)."""
    config = AgentConfig(
        region="eu-west",
        workspace_root=tmp_path / "workspaces",
        journal=tmp_path / "journal.sqlite3",
        security_tool=tool,
        run_as="relevo-build",
    )
    with pytest.raises(KeychainFailure) as refused:
        Keychains(config, system="Darwin").require()  # the stage calls it before it reads any identity
    assert refused.value.error_class is ErrorClass.KEYCHAIN_UNSUPPORTED
    assert refused.value.message.startswith(
        "the project's signing.keychain: temporary is not made on an agent with run_as (relevo-build): the "
        "keychain would be root's"
    )
    assert security_double.calls(tool) == []


def _project(**signing) -> dict:
    return {
        "id": "app",
        "repo": "acme/app",
        "region_affinity": "eu-west",
        "stages": [{"name": "sign", "run": "true"}],
        "signing": signing,
    }


def test_a_projects_identities_must_be_under_its_own_regions_signing_prefix():
    ok = {
        "p12_ref": "relevo/stk/_signing/eu-west/app/dist.p12",
        "passphrase_ref": "relevo/stk/_signing/eu-west/app/dist.pass",
    }
    project = Project.model_validate(_project(keychain="temporary", identities=[ok]))
    assert project.signing is not None and project.signing.identities[0].p12_ref == ok["p12_ref"]
    other_region = {**ok, "p12_ref": "relevo/stk/_signing/us-east/app/dist.p12"}
    with pytest.raises(
        ValueError,
        match=r"signing.identities\[0\].p12_ref .* is not under relevo/<stack>/_signing/eu-west/app/",
    ):
        Project.model_validate(_project(keychain="temporary", identities=[other_region]))
    with pytest.raises(ValueError, match="String should match pattern"):  # a webhook secret is no identity
        Project.model_validate(
            _project(keychain="temporary", identities=[{**ok, "passphrase_ref": "relevo/stk/app/github"}])
        )
    with pytest.raises(ValueError, match="Input should be 'temporary'"):
        Project.model_validate(_project(keychain="login", identities=[ok]))
    with pytest.raises(ValueError, match="at least 1 item"):
        Project.model_validate(_project(keychain="temporary", identities=[]))
