"""The README stays a short entry and the reference lives in docs/ (issue 17).

Given the README and every page of docs/, then the README is under 250 lines and keeps its two
commands, the layout near the top, the first-project path and the job-flow picture; each docs page
opens with what it covers and who it is for; and every section the long README had is a section
of the README or of exactly one docs page, and the README links each page.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").glob("*.md"))

# The `##` / `###` sections of the README before it was split.
OLD_SECTIONS = [
    "The two commands",
    "Your first project",
    "The demo",
    "How a job flows",
    "Same-project serial",
    "Stage dispatch: three timeouts, classified retries",
    "Plan limits",
    "DLQ freeze",
    "Listing jobs",
    "Queue control",
    "Live logs and artifacts",
    "Approval gate",
    "Metrics and the dashboard",
    "OpenAPI",
    "The local stack",
    "Deploy to AWS",
    "Retention",
    "Connect a Mac",
    "Journal, reconcile before retry, staged shutdown (relevo-agent)",
    "Fencing: the lease timeline",
    "The disaster drill: `relevo-tools drill`",
    "Agent presence and retry placement",
    "Stage output and artifacts",
    "Triggers",
    "Exactly once",
    "Permissions",
    "Error codes",
    "Layout",
]


def _headings(text: str) -> list[str]:
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.findall(r"^#{2,3} (.+)$", text, flags=re.M)


def test_the_readme_is_short_and_keeps_its_entry_sections_in_order() -> None:
    text = README.read_text()
    assert len(text.splitlines()) < 250
    kept = ["The two commands", "Layout", "Your first project", "How a job flows", "Documentation"]
    headings = _headings(text)
    assert [h for h in headings if h in kept] == kept


def test_each_docs_page_opens_with_what_it_covers_and_for_whom() -> None:
    for page in PAGES:
        lines = page.read_text().splitlines()
        assert lines[0].startswith("# "), f"{page.name}: no title"
        opening = " ".join(lines[2:6])
        assert lines[1] == "" and opening.strip(), f"{page.name}: no opening paragraph"
        if page.name not in ("project-file.md", "agent-config.md"):  # generated reference pages
            assert re.match(r"For (?:\w+ )*?(?:engineer|operator|whoever|anyone)", opening), (
                f"{page.name}: says not who it is for"
            )


def test_every_old_readme_section_has_one_home() -> None:
    homes: dict[str, list[str]] = {}
    for path in [README, *PAGES]:
        for heading in _headings(path.read_text()):
            homes.setdefault(heading, []).append(path.name)
    missing = [s for s in OLD_SECTIONS if s not in homes]
    twice = {s: homes[s] for s in OLD_SECTIONS if len(homes.get(s, [])) > 1}
    assert missing == [] and twice == {}


def test_the_readme_links_every_docs_page() -> None:
    text = README.read_text()
    assert [p.name for p in PAGES if f"](docs/{p.name})" not in text] == []


def test_every_sam_deploy_the_docs_give_runs_without_telemetry():
    """`make build` sets SAM_CLI_TELEMETRY=0; a deploy line copied from the docs must too, or SAM
    prints its telemetry banner and reports home."""
    lines = [
        line
        for page in (ROOT / "docs").glob("*.md")
        for line in page.read_text().splitlines()
        if re.search(r"\bsam deploy\b", line) and "bin/sam" in line
    ]
    assert lines, "the docs give no sam deploy command"
    assert all("SAM_CLI_TELEMETRY=0" in line for line in lines), [
        line for line in lines if "SAM_CLI_TELEMETRY=0" not in line
    ]
