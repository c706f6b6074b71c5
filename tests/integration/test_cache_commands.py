"""`relevo cache list|show|delete` and their routes against the local stack: the listing is what the
table holds (keys, sizes, last used, hits), an entry is shown and deleted (its record and manifest
gone, its key then misses), a viewer may list but not delete, and a refusal is one line, exit 2.

Entries are saved and restored with the agent's own cache path (relevo_agent.caches)."""

from __future__ import annotations

import json
import secrets
from dataclasses import asdict
from datetime import UTC, datetime, timedelta

import pytest
from botocore.exceptions import ClientError
from typer.testing import CliRunner

from relevo_cli.api import ApiError
from relevo_cli.main import app
from relevo_core.aws import client
from relevo_core.models.cache import CacheSpec, cache_prefix, entry_object
from relevo_core.store import cache_entries
from tests.helpers.iam import iam_user
from tests.helpers.stack import register_project
from tests.integration.test_caches import Mac

SPEC = CacheSpec(name="deps", paths=("build",), key="deps-{arch}-{hash:Package.resolved}")
runner = CliRunner()


class SetClock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


pytestmark = pytest.mark.usefixtures("wide_console")


def _save(mac: Mac, lock: str) -> str:
    (mac.workspace / "build").mkdir(exist_ok=True)
    (mac.workspace / "Package.resolved").write_text(lock)
    (mac.workspace / "build" / "out.txt").write_text(f"built for {lock}\n" * 50)
    outcome = mac.stage(SPEC)
    assert outcome.save == "saved", outcome
    return outcome.key


def _cli(stack_file, *args: str):
    return runner.invoke(app, ["cache", *args, "--stack-file", str(stack_file)], terminal_width=250)


def test_cache_list_show_and_delete_agree_with_the_store(local_stack, tmp_path):
    # Given a project with two entries in its region, one of them restored twice
    project = f"cachecli-{secrets.token_hex(3)}"
    register_project(
        local_stack,
        project,
        [{"name": "build", "run": "true", "cache": ["deps"]}],
        caches=[SPEC.model_dump(mode="json")],
    )
    start = datetime(2026, 12, 1, tzinfo=UTC)
    a = Mac(local_stack, tmp_path / "mac-a", project, clock=SetClock(start))
    one = _save(a, "one")
    a.clock.now = start + timedelta(hours=1)
    two = _save(a, "two")
    b = Mac(local_stack, tmp_path / "mac-b", project, clock=SetClock(start + timedelta(hours=2)))
    (b.workspace / "Package.resolved").write_text("one")
    for _ in range(2):
        assert b.restore(SPEC)[1][0].outcome.restore == "hit"
    stack_file = tmp_path / "stack.json"
    stack_file.write_text(json.dumps(local_stack.model_dump()))
    scope = f"{project}/eu-west"

    # When the operator lists the caches (JSON and table)
    listed = _cli(stack_file, "list", project, "--json")
    table = _cli(stack_file, "list", project)

    # Then the listing is the table's entries, most recently used first, with the total
    assert listed.exit_code == 0, listed.output
    answer = json.loads(listed.output)
    stored = sorted(
        (asdict(record) for record in cache_entries.list_entries(local_stack.table_name, scope)),
        key=lambda entry: entry["last_used_at"],
        reverse=True,
    )
    assert answer["entries"] == stored and [entry["cache_key"] for entry in stored] == [one, two]
    assert answer["entries"][0]["hits"] == 2 and answer["total_bytes"] == sum(e["size"] for e in stored)
    assert answer["region"] == "eu-west" and answer["max_total_bytes"] == 10 * 1024**3
    assert table.exit_code == 0 and one in table.output and two in table.output

    # When one entry is shown, Then it is its record
    shown = _cli(stack_file, "show", project, one, "--json")
    assert shown.exit_code == 0 and json.loads(shown.output)["hits"] == 2

    # When a viewer tries to delete it, Then it is refused (FORBIDDEN) and the entry stays
    viewer = iam_user(local_stack, f"cache-view-{secrets.token_hex(3)}")
    from relevo_cli.api import RelevoApi

    RelevoApi.for_stack(local_stack).grant(project, viewer.arn, "view")
    assert viewer.api.caches(project, None)["count"] == 2
    try:
        viewer.api.delete_cache_entry(project, one, None)
        raise AssertionError("a viewer deleted a cache entry")
    except ApiError as exc:
        assert exc.status == 403 and "FORBIDDEN" in str(exc) and "needs operate" in str(exc)
    assert cache_entries.get_entry(local_stack.table_name, scope, one) is not None

    # When the operator deletes it
    deleted = _cli(stack_file, "delete", project, one)

    # Then its record and manifest are gone and its key misses; the other entry stays
    assert deleted.exit_code == 0, deleted.output
    assert cache_entries.get_entry(local_stack.table_name, scope, one) is None
    try:
        client("s3").head_object(
            Bucket=local_stack.resources["ArtifactBucket"],
            Key=cache_prefix(project, "eu-west") + entry_object(one),
        )
        raise AssertionError("the manifest is still stored")
    except ClientError as exc:
        assert exc.response["Error"]["Code"] in ("404", "NoSuchKey")
    assert b.restore(SPEC)[1][0].outcome.restore == "miss"
    assert [
        e["cache_key"] for e in json.loads(_cli(stack_file, "list", project, "--json").output)["entries"]
    ] == [two]

    # When an entry that is not there is shown, Then one line, exit 2, with its code
    missing = _cli(stack_file, "show", project, one)
    lines = [line for line in missing.output.splitlines() if line.strip()]
    assert missing.exit_code == 2 and len(lines) == 1 and "CACHE_ENTRY_NOT_FOUND" in lines[0], missing.output
