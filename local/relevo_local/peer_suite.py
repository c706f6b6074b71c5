"""A real peer project's test suite for the sharded-tests drill, demo and bench: more-itertools
10.7.0's sdist from PyPI (tests/test_more.py and tests/test_recipes.py, 671 tests under pytest),
pinned by sha256 and unpacked once into the venv (`make .venv/.relevo-installed` runs
`python -m relevo_local.peer_suite`; a later call that finds it unpacked fetches nothing)."""

from __future__ import annotations

import sys
from pathlib import Path

from relevo_local.pypi_sdist import PinnedSdist

# The link https://pypi.org/simple/more-itertools/ gives more_itertools-10.7.0.tar.gz, its sha256.
MORE_ITERTOOLS = PinnedSdist(
    "more-itertools",
    "10.7.0",
    "https://files.pythonhosted.org/packages/ce/a0/834b0cebabbfc7e311f30b46c8188790a37f89fc8d756660346fe5abfd09/"
    "more_itertools-10.7.0.tar.gz",
    "9fddd5403be01a94b204faadcff459ec3568cf110265d3c54323e1e866ad29d3",
)
# What `python -m pytest --collect-only -q` lists in it.
TESTS = 671


def suite() -> Path:
    """The unpacked sdist: its package, tests/ and configuration."""
    return MORE_ITERTOOLS.unpacked()


if __name__ == "__main__":
    print(suite())
    sys.exit(0)
