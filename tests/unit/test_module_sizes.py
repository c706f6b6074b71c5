"""No product module over 500 lines (issue 43: rooms that say what they hold): a module that long
holds more than one thing, and is split by what it holds.

Given every Python module that ships or that a user runs (the core layer, the agent, the CLI, the
emulator, the tools and the function handlers), when its lines are counted, then none has more
than MAX_LINES. The benches and the tests are measurements, not product, and are not counted.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = [
    ROOT / "layers" / "core" / "relevo_core",
    ROOT / "agent" / "relevo_agent",
    ROOT / "cli" / "relevo_cli",
    ROOT / "local" / "relevo_local",
    ROOT / "tools" / "relevo_tools",
    ROOT / "functions",
]
MAX_LINES = 500


def test_no_product_module_is_over_five_hundred_lines():
    # Given every product module
    modules = [path for folder in PRODUCT for path in sorted(folder.rglob("*.py"))]
    assert len(modules) > 100, "the product's folders moved: update PRODUCT"

    # When their lines are counted
    long = {
        str(path.relative_to(ROOT)): lines
        for path in modules
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }

    # Then none is over the limit
    assert long == {}, f"split by what they hold: {long}"
