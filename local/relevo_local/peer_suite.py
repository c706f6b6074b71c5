"""Real peer projects' test suites for the sharded-tests drill, demo and bench, each an sdist from
PyPI pinned by sha256 and unpacked once into the venv (`make .venv/.relevo-installed` runs
`python -m relevo_local.peer_suite`, which fetches every one; a later call that finds them
unpacked fetches nothing):

- more-itertools 10.7.0 (tests/test_more.py and tests/test_recipes.py, 670 of its 671 tests): the
  suite the e2e test, the demo and the bench shard. One of its tests takes most of its time. The
  one left out, CallbackIterTests.test_exception, reads `it.result` as soon as the first callback
  has come, before the iterator's worker thread has raised: on a busy host it finds the function
  not yet done ("RuntimeError: Function has not yet completed"), a race in the peer's own test
  (the demo's examples/demo/peer-tests.yaml leaves it out the same way).
- parso 0.8.7 (test/ and its modules' doctests, 1988 of its 1989 tests, no test dependency but
  pytest): the bench's second suite, whose time is spread so that a split of whole tests can come
  close to the mean (its longest test, about a seventh of the suite, is under half a 4-way shard's
  mean). The one left out is deselected because its node id, a parametrized source text of 11,163
  characters, is over the 1,024 Relevo takes (MAX_TEST_ID_CHARS): a listing with it is refused."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from relevo_local.pypi_sdist import PinnedSdist


@dataclass(frozen=True)
class PeerSuite:
    """A pinned sdist whose tests run with `pytest -c <config>` from its top directory."""

    sdist: PinnedSdist
    # What `python -m pytest -c <config> --collect-only -q` lists in it.
    tests: int
    # The suite's own pytest configuration file, relative to its top directory.
    config: str
    # Node id prefixes left out of its listing and runs (pytest's --deselect).
    deselect: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.sdist.name

    def unpacked(self) -> Path:
        return self.sdist.unpacked()


# The link https://pypi.org/simple/more-itertools/ gives more_itertools-10.7.0.tar.gz, its sha256.
MORE_ITERTOOLS = PinnedSdist(
    "more-itertools",
    "10.7.0",
    "https://files.pythonhosted.org/packages/ce/a0/834b0cebabbfc7e311f30b46c8188790a37f89fc8d756660346fe5abfd09/"
    "more_itertools-10.7.0.tar.gz",
    "9fddd5403be01a94b204faadcff459ec3568cf110265d3c54323e1e866ad29d3",
)
# The link https://pypi.org/simple/parso/ gives parso-0.8.7.tar.gz, its sha256.
PARSO = PinnedSdist(
    "parso",
    "0.8.7",
    "https://files.pythonhosted.org/packages/30/4b/90c937815137d43ce71ba043cd3566221e9df6b9c805f24b5d138c9d40a7/"
    "parso-0.8.7.tar.gz",
    "eaaac4c9fdd5e9e8852dc778d2d7405897ec510f2a298071453e5e3a07914bb1",
)

SUITES = {
    "more-itertools": PeerSuite(
        MORE_ITERTOOLS,
        tests=670,
        config="pyproject.toml",
        deselect=("tests/test_more.py::CallbackIterTests::test_exception",),
    ),
    "parso": PeerSuite(
        PARSO,
        tests=1988,
        config="pytest.ini",
        deselect=("test/test_python_errors.py::test_python_exception_matches[def f():",),
    ),
}
# more-itertools, as the e2e test and the demo read it.
MORE_ITERTOOLS_SUITE = SUITES["more-itertools"]
TESTS = MORE_ITERTOOLS_SUITE.tests


def suite(name: str = "more-itertools") -> Path:
    """The unpacked sdist of the named suite: its package, tests and configuration."""
    return SUITES[name].unpacked()


if __name__ == "__main__":
    for name in SUITES:
        print(suite(name))
    sys.exit(0)
