"""Fixtures of the e2e modules: one `relevo local up` per test worker, shared by the modules that
run their agents on a stack rather than testing the stack itself.

Starting the stack as a process costs about 13 CPU-s (15 with its stop) whatever its regions: one
stack per worker instead of one per module. The modules stay apart by region affinity (each
module's own, listed below, its agents polling only its queues) and by project and agent ids;
a module that starts, stops or kills a stack of its own (test_local_stack_commands,
test_walking_skeleton, test_drill...) keeps its own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from relevo_core.files.stack import StackInfo
from relevo_local.processes import local_stack

# Every region affinity a module of the shared stack uses (each module's REGIONS): a region is
# deployed with the stack (its queues and agent role), so the shared one holds them all.
SHARED_REGIONS = (
    "eu-west",  # test_reconcile_agents
    "lost",
    "stopped",  # test_agents_offline
    "share",
    "retry",
    "solo",  # test_agents_share_and_retry
    "pause",
    "drain",
    "dispatch",
    "caps",
    "disk",
    "shared",
    "quota",  # test_fleet
    "relay",  # test_handoff_chain
    "shards",  # test_parallel_shards
    "peer",  # test_peer_suite
    "signing",
    "nosign",  # test_signing_keychain
)


@pytest.fixture(scope="session")
def shared_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[StackInfo, Path]]:
    """The worker's shared stack and its stack.json, started by the first module that asks and
    stopped at the worker's end. It does not point this process at itself: each module does, for
    its own life (tests.helpers.stack.regions_of), so other tests keep the session's emulator."""
    state_dir = tmp_path_factory.mktemp("shared-stack")
    with local_stack(
        state_dir, state_dir / "local-up.log", ["--region-affinities", ",".join(SHARED_REGIONS)]
    ) as info:
        yield info, state_dir / "stack.json"
