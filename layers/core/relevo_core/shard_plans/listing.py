"""A stage's test listing, as the runner that lists them writes it, read into planned tests: each
its canonical id (relevo_core.models.test_results, the id the shards' reports give) and the id as
listed (what the shard's runner is handed back in $RELEVO_SHARD_TESTS).

Formats (TestListFormat):
  - `pytest`: `pytest --collect-only -q`, one node id a line, then a blank line and the count;
  - `xcodebuild`: `xcodebuild test-without-building -enumerate-tests -test-enumeration-format json
    -test-enumeration-style flat` (`{"errors": [], "values": [{"testPlan": …, "enabledTests":
    [{"identifier": "Target/Class/test()"}], "disabledTests": […]}]}`); its enabled tests only;
  - `lines`: one canonical id a line.
"""

from __future__ import annotations

import hashlib
import json

from relevo_core.models.stage_tests import TestListFormat
from relevo_core.models.test_results import MAX_TEST_ID_CHARS, MAX_TESTS, PlannedTest, pytest_node_id


class ListingInvalid(ValueError):
    """The listing cannot be read as its format says: the message says where."""


def listing_sha256(listing: bytes) -> str:
    return hashlib.sha256(listing).hexdigest()


def listed_part(listing: bytes, format: TestListFormat) -> bytes:
    """What of a listing its format reads, whose sha256 the shards of a stage compare: for
    `pytest`, the node ids before the first blank line, without the count and the time that
    pytest prints after them (`671 tests collected in 0.43s` on one Mac, `in 0.51s` on the next);
    the others as they are."""
    if format != "pytest":
        return listing
    kept = []
    for line in listing.split(b"\n"):
        if not line.strip():
            break
        kept.append(line)
    return b"".join(line + b"\n" for line in kept)


def xcode_test_id(identifier: str) -> str:
    """`Target/Class/test()` (Swift Testing's free function: `Target/test()`) to the canonical id,
    its suite the target and class (`Target/Class`), as the results of an Xcode bundle name it."""
    parts = identifier.split("/")
    if len(parts) < 2 or not all(parts[:2]):
        raise ListingInvalid(f"{identifier!r} is not an Xcode test identifier (Target/Class/test)")
    if len(parts) == 2:
        return f"{parts[0]}::{parts[1]}"
    return f"{parts[0]}/{parts[1]}::{'/'.join(parts[2:])}"


def _pytest(text: str) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    for line in text.splitlines():
        if not line.strip():
            break  # the node ids end at the first blank line; the count and warnings follow
        if "::" not in line:
            raise ListingInvalid(f"line {len(found) + 1}: {line[:200]!r} is not a pytest node id")
        found.append((pytest_node_id(line), line))
    return found


def _xcodebuild(text: str) -> list[tuple[str, str]]:
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise ListingInvalid(f"not JSON (-test-enumeration-format json): {exc}") from None
    if not isinstance(document, dict) or not isinstance(document.get("values"), list):
        raise ListingInvalid('not an -enumerate-tests document: no "values" list')
    if document.get("errors"):
        raise ListingInvalid(f"xcodebuild reported errors: {str(document['errors'])[:500]}")
    found: list[tuple[str, str]] = []
    for configuration in document["values"]:
        enabled = configuration.get("enabledTests") if isinstance(configuration, dict) else None
        if not isinstance(enabled, list):
            raise ListingInvalid('a configuration of "values" has no "enabledTests" list')
        for test in enabled:
            identifier = test.get("identifier") if isinstance(test, dict) else None
            if not isinstance(identifier, str):
                raise ListingInvalid(f"an enabled test without an identifier: {str(test)[:200]}")
            found.append((xcode_test_id(identifier), identifier))
    return found


def _lines(text: str) -> list[tuple[str, str]]:
    return [(line.strip(), line.strip()) for line in text.splitlines() if line.strip()]


def read_listing(listing: bytes, format: TestListFormat) -> list[PlannedTest]:
    """The listing's tests in its order, each once (a test listed twice, e.g. by two test plans
    of one scheme, is planned once). ListingInvalid when it is not what its format says, or over
    the limits (MAX_TESTS tests, MAX_TEST_ID_CHARS an id): a plan is never made of part of it."""
    try:
        text = listing.decode()
    except UnicodeDecodeError as exc:
        raise ListingInvalid(f"not UTF-8 at byte {exc.start}") from None
    pairs = {"pytest": _pytest, "xcodebuild": _xcodebuild, "lines": _lines}[format](text)
    tests: dict[str, PlannedTest] = {}
    for canonical, listed in pairs:
        if len(canonical) > MAX_TEST_ID_CHARS or len(listed) > MAX_TEST_ID_CHARS:
            raise ListingInvalid(f"a test id is over {MAX_TEST_ID_CHARS} characters: {listed[:100]!r}…")
        tests.setdefault(canonical, PlannedTest(id=canonical, listed=listed))
        if len(tests) > MAX_TESTS:
            raise ListingInvalid(f"over {MAX_TESTS} tests listed")
    return list(tests.values())
