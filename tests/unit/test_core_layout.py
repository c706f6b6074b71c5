"""The top of relevo_core holds only what every component shares (issue 43: rooms that say what
they hold): everything else lives in the domain folder it belongs to.

Given the modules directly under layers/core/relevo_core, when they are counted (beside
__init__.py), then there are at most MAX_TOP_MODULES.
"""

from __future__ import annotations

from pathlib import Path

CORE = Path(__file__).resolve().parents[2] / "layers" / "core" / "relevo_core"
# aws, checks, execution, http, observability, openapi, plan_limits: plumbing and contracts every
# domain folder builds on. A new module goes into its domain folder, not here.
MAX_TOP_MODULES = 7


def test_the_core_top_holds_at_most_seven_modules_beside_its_init():
    # Given the modules at the top of relevo_core
    top = sorted(path.stem for path in CORE.glob("*.py") if path.name != "__init__.py")

    # Then they are few: the rest live in domain folders
    assert len(top) <= MAX_TOP_MODULES, f"{len(top)} loose modules at relevo_core's top: {', '.join(top)}"
