"""A location read from a record an agent wrote is acted on only when it is one of its job's objects
(relevo_core.models.job_objects): the check against path tricks, and the list of every reader and remover
of such a location in the core and the functions, each of which must go through the check."""

from __future__ import annotations

import ast
import logging
from pathlib import Path

import pytest

from relevo_core.models.errors import ErrorCode, RelevoError
from relevo_core.models.job_objects import JobPrefix, artifact_key, expected_key, manifest_key, object_key

ROOT = Path(__file__).resolve().parents[2]
HOME = JobPrefix.of("s3://relevo-artifacts/p/job_x/")
RECORD = ("ARTIFACTS#job_x", "build#app.ipa")


def test_an_object_under_the_jobs_own_prefix_is_its_key():
    assert object_key(HOME, "s3://relevo-artifacts/p/job_x/build/app.ipa", RECORD) == "p/job_x/build/app.ipa"
    assert (
        object_key(HOME, "s3://relevo-artifacts/p/job_x/build/a%20b.txt", RECORD) == "p/job_x/build/a%20b.txt"
    )
    assert JobPrefix.of("s3://relevo-artifacts/p/job_x") == HOME


@pytest.mark.parametrize(
    "location",
    [
        "s3://relevo-artifacts/q/job_y/build/app.ipa",  # another project's object
        "s3://relevo-artifacts/p/job_z/build/app.ipa",  # another job of the same project
        "s3://relevo-artifacts/p/job_xx/build/app.ipa",  # a string prefix, not a path prefix
        "s3://relevo-artifacts/p/job_x",  # the prefix itself, no /
        "s3://relevo-artifacts/p/job_x/",  # the prefix, no object
        "s3://relevo-artifacts/p/job_x/../../q/job_y/app.ipa",  # climbs out
        "s3://relevo-artifacts/p/job_x/build/./app.ipa",
        "s3://relevo-artifacts/p/job_x//q/job_y/app.ipa",  # an empty segment
        "s3://relevo-artifacts//p/job_x/app.ipa",
        "s3://relevo-artifacts/p/job_x/%2e%2e/%2e%2e/q/job_y/app.ipa",  # encoded ..
        "s3://relevo-artifacts/p/job_x/a%2f..%2f..%2fq/app.ipa",  # encoded / and ..
        "s3://relevo-artifacts/p/job_x/build\\..\\app.ipa",
        "s3://other-bucket/p/job_x/build/app.ipa",  # another bucket, the job's key
        "s3://relevo-artifacts.evil/p/job_x/build/app.ipa",
        "s3://relevo-artifacts:443/p/job_x/build/app.ipa",
        "p/job_x/build/app.ipa",  # a bare key: not an s3:// URI
        "https://relevo-artifacts.s3.amazonaws.com/p/job_x/build/app.ipa",
        "S3://relevo-artifacts/p/job_x/build/app.ipa",
        "",
    ],
)
def test_a_location_outside_the_job_is_refused_with_its_code_and_logged_with_the_records_key(
    location, caplog
):
    # Given a location an agent wrote into its job's record, When it is checked against the job,
    with caplog.at_level(logging.WARNING, logger="relevo_core.models.job_objects"):
        with pytest.raises(RelevoError) as refused:
            object_key(HOME, location, RECORD)
    # Then it is refused, LOCATION_OUTSIDE_JOB (409), naming the record, and the log says where it pointed.
    assert refused.value.code is ErrorCode.LOCATION_OUTSIDE_JOB and refused.value.status == 409
    assert refused.value.details == {"pk": "ARTIFACTS#job_x", "sk": "build#app.ipa"}
    assert "ARTIFACTS#job_x build#app.ipa" in caplog.text and repr(location) in caplog.text


def test_a_derived_key_is_taken_only_when_the_stored_location_is_that_very_object():
    derived = artifact_key(HOME, "build", "app.ipa", None, handoff=False)
    assert derived == "p/job_x/build/app.ipa"
    assert artifact_key(HOME, "test", "app.ipa", 1, handoff=False) == "p/job_x/test/shard-1/app.ipa"
    assert (
        artifact_key(HOME, "build", ".relevo-handoff/packs/ab", None, handoff=True)
        == "p/job_x/.relevo-handoff/packs/ab"
    )
    assert manifest_key(HOME, "build", None, 2) == "p/job_x/.relevo-handoff/manifests/build.2.json"
    assert manifest_key(HOME, "test", 1, 1) == "p/job_x/.relevo-handoff/manifests/test.shard-1.1.json"
    assert expected_key(HOME, f"s3://relevo-artifacts/{derived}", derived, RECORD) == derived
    # Another object of the job than the record's own name gives, or a name that climbs out.
    for location, key in (
        ("s3://relevo-artifacts/p/job_x/build/other.ipa", derived),
        ("s3://relevo-artifacts/p/job_x/build/../../q/y", "p/job_x/build/../../q/y"),
    ):
        with pytest.raises(RelevoError) as refused:
            expected_key(HOME, location, key, RECORD)
        assert refused.value.code is ErrorCode.LOCATION_OUTSIDE_JOB


# ------------------------------------------------------------------ every reader goes through it

# S3 object calls, and reads of a stored location (an artifact's `uri`, a handoff's `manifest`, a
# log chunk's `body`), in the core and the functions.
S3_OBJECT_CALLS = {
    "generate_presigned_url",
    "delete_object",
    "delete_objects",
    "get_object",
    "head_object",
    "copy_object",
    "put_object",
    "upload_file",
    "download_file",
    "get_object_attributes",
}
LOCATIONS = {"uri", "manifest"}
# `body` is a location only beside log chunks (elsewhere: HTTP bodies).
LOG_LOCATION = "body"

# Every function that reads a stored location or calls S3 on an object, with the check its body
# calls (relevo_core.models.job_objects, or a checked derivation), or why it needs none.
READERS = {
    "relevo_core/fleet/test_plans.py::_durations_of_job": "object_key",
    "relevo_core/jobs/artifacts.py::artifact_link": "stored_object",
    "relevo_core/jobs/artifacts.py::stored_object": "expected_key",
    "relevo_core/jobs/artifact_quota.py::enforce": "stored_object",
    "relevo_core/jobs/artifact_quota.py::count_change": "checked_image",
    "relevo_core/jobs/handoff_sources.py::EarlierStage.manifest_key": "expected_key",
    "relevo_core/jobs/handoff_sources.py::require_handoffs_stored": "manifest_key",
    "relevo_core/store/log_reads.py::_with_bodies.filled": "object_key",
    "relevo_core/jobs/results_listing.py::_job_tests": "expected_key",
}
NEEDS_NO_CHECK = {
    "relevo_core/fleet/test_plans.py::_stored_listing": "derives the listing's key from the job and the "
    "request's sha256 (test_listing_key), and checks the bytes against it",
    "relevo_core/fleet/test_plans.py::plan_for_shard": "writes the plan at the key it derives "
    "(test_plan_key); the key it answers with is on the job's record, which only the functions write",
    "relevo_core/models/job_objects.py::JobPrefix.__str__": "the check itself",
    "relevo_core/models/job_objects.py::expected_key": "the check itself",
    "relevo_core/jobs/artifact_quota.py::home_after_job": "names a project only; count_change checks the "
    "image against it (checked_image)",
    "relevo_core/jobs/artifact_quota.py::delete_stored_object": "the remover's primitive: enforce hands it "
    "the key stored_object gave",
    "relevo_core/store/log_bodies.py::get_body": "a primitive: _with_bodies hands it the key object_key gave",
    "relevo_core/store/log_bodies.py::put_body": "the agent's writer, under its own job's prefix (its "
    "session allows no other)",
    "relevo_core/store/log_writer.py::ChunkWriter._entries.store": "the agent's writer",
    "relevo_core/store/log_reads.py::_with_bodies": "picks the chunks with a body; `filled` reads each "
    "through object_key",
    "relevo_core/jobs/stage_records.py::handoff_of": "shows a receipt's manifest as text, acts on nothing",
    "relevo_core/caches/eviction.py::_objects_of": "reads an entry's manifest at the key it derives from "
    "the entry's key (entry_object) under the cache prefix it derives; never a stored location",
    "relevo_core/caches/eviction.py::delete_cache_objects": "deletes keys evict derives (entry_object) or "
    "lists under the cache prefix (_caches/, no job's prefix); never a stored location",
    "relevo_core/jobs/results_listing.py::_document": "reads the key _job_tests derived and checked "
    "(expected_key)",
    "relevo_core/store/results_documents.py::read_document": "a primitive: _job_tests hands it the key "
    "expected_key gave, or an earlier attempt's derived from the job's prefix",
}


def _functions(tree: ast.AST, qual: tuple[str, ...] = ()) -> list[tuple[str, ast.AST]]:
    found = []
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = (*qual, node.name)
            if not isinstance(node, ast.ClassDef):
                found.append((".".join(name), node))
            found += _functions(node, name)
    return found


def _own_nodes(function: ast.AST) -> list[ast.AST]:
    """The nodes of a function's body, without those of functions defined inside it."""
    nodes, stack = [], list(ast.iter_child_nodes(function))
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        nodes.append(node)
        stack += ast.iter_child_nodes(node)
    return nodes


def _touches_a_location(nodes: list[ast.AST], log_chunks_module: bool) -> bool:
    names = LOCATIONS | ({LOG_LOCATION} if log_chunks_module else set())
    for node in nodes:
        if (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", None)) in S3_OBJECT_CALLS
        ):
            return True
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) and node.attr in names:
            return True
        if isinstance(node, ast.Constant) and node.value in names:
            return True
    return False


def _calls(nodes: list[ast.AST]) -> set[str]:
    called = set()
    for node in nodes:
        if isinstance(node, ast.Call):
            func = node.func
            called.add(func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", ""))
    return called


def _sources() -> dict[str, ast.AST]:
    files = [*(ROOT / "layers" / "core").rglob("relevo_core/**/*.py"), *(ROOT / "functions").rglob("*.py")]
    return {
        str(
            path.relative_to(ROOT / "layers" / "core") if "layers" in path.parts else path.relative_to(ROOT)
        ): ast.parse(path.read_text())
        for path in files
    }


def test_every_reader_and_remover_of_an_agent_written_location_goes_through_the_check():
    # Given every function of the core and the functions,
    found: dict[str, ast.AST] = {}
    for module, tree in _sources().items():
        log_module = "log_chunks" in ast.unparse(tree) or "log_bodies" in ast.unparse(tree)
        for name, function in _functions(tree):
            if _touches_a_location(_own_nodes(function), log_module):
                found[f"{module}::{name}"] = function
    # Then each one that reads a stored location or calls S3 on an object is listed: a new
    # reader that bypasses relevo_core.models.job_objects fails here until it is checked and listed.
    unlisted = sorted(set(found) - set(READERS) - set(NEEDS_NO_CHECK))
    assert unlisted == [], (
        f"read a stored location or call S3 without relevo_core.models.job_objects: {unlisted}"
    )
    assert sorted(set(READERS) | set(NEEDS_NO_CHECK)) == sorted(found), "listed, but no longer found"
    # And each reader calls its check.
    unchecked = [name for name, check in READERS.items() if check not in _calls(_own_nodes(found[name]))]
    assert unchecked == []


def test_the_primitives_that_take_a_checked_key_are_called_by_checked_readers_only():
    callers: dict[str, set[str]] = {"get_body": set(), "delete_object": set()}
    for module, tree in _sources().items():
        for name, function in _functions(tree):
            for called in _calls(_own_nodes(function)) & set(callers):
                callers[called].add(f"{module}::{name}")
    assert callers["get_body"] == {"relevo_core/store/log_reads.py::_with_bodies.filled"}
    assert callers["delete_object"] == {
        # Keys under the cache prefix (_caches/, no job's prefix), derived from entries' keys or listed.
        "relevo_core/caches/eviction.py::delete_cache_objects",
        "relevo_core/jobs/artifact_quota.py::enforce",
        "relevo_core/jobs/artifact_quota.py::delete_stored_object",
    }


# Every path that reads a job's log bodies, from the route and the job view down to _with_bodies
# (whose `filled` checks each body with object_key): its callers, each handing on the job's prefix
# (`home`), which log_page and show_job read from the job's record once per page.
LOG_BODY_CALLERS = {
    "_with_bodies": {
        "relevo_core/store/log_reads.py::read_forward",
        "relevo_core/store/log_reads.py::read_backward",
    },
    "read_forward": {"relevo_core/store/log_reads.py::read_chunks", "relevo_core/jobs/log_page.py::log_page"},
    "read_backward": {"relevo_core/jobs/log_page.py::log_page", "relevo_core/jobs/logs.py::log_tail"},
    "log_tail": {"relevo_core/jobs/view.py::show_job"},
}


def _passes_home(call: ast.Call) -> bool:
    return any(keyword.arg == "home" for keyword in call.keywords) or any(
        isinstance(arg, ast.Name) and arg.id == "home" for arg in call.args
    )


def test_every_reader_of_a_jobs_log_bodies_hands_on_the_jobs_prefix():
    # Given every call of the functions that lead to a log body being read,
    callers: dict[str, set[str]] = {name: set() for name in LOG_BODY_CALLERS}
    without_home: list[str] = []
    for module, tree in _sources().items():
        for name, function in _functions(tree):
            for node in _own_nodes(function):
                if isinstance(node, ast.Call):
                    called = (
                        node.func.attr
                        if isinstance(node.func, ast.Attribute)
                        else getattr(node.func, "id", "")
                    )
                    if called in callers:
                        callers[called].add(f"{module}::{name}")
                        if not _passes_home(node):
                            without_home.append(f"{module}::{name} -> {called}")
    # Then the paths are these (forward, back, the tail), and each call hands on the job's prefix.
    assert callers == LOG_BODY_CALLERS
    assert without_home == []
