"""The `relevo` CLI's shape as a person meets it, with no stack: one grammar (noun, then verb), the
older spellings still working but left out of --help, `--version`, and help text without type
tags."""

from __future__ import annotations

import re
from importlib import metadata

import pytest
from typer.testing import CliRunner

from relevo_cli.main import app

runner = CliRunner()

# Older spelling -> the command it is now.
ALIASES = {
    ("status",): ("job", "view"),
    ("jobs",): ("job", "list"),
    ("run",): ("project", "run"),
    ("rerun",): ("job", "rerun"),
    ("approve",): ("job", "approve"),
    ("reject",): ("job", "reject"),
    ("cancel",): ("job", "cancel"),
    ("release",): ("job", "release"),
    ("promote",): ("job", "promote"),
    ("logs",): ("job", "logs"),
    ("deliveries",): ("delivery", "list"),
    ("job", "show"): ("job", "view"),
    ("project", "show"): ("project", "view"),
    ("dlq", "show"): ("dlq", "view"),
    ("agents",): ("agent", "list"),
    ("agents", "pause"): ("agent", "pause"),
    ("agents", "drain"): ("agent", "drain"),
    ("agents", "resume"): ("agent", "resume"),
    ("agents", "pause-region"): ("region", "pause"),
    ("agents", "resume-region"): ("region", "resume"),
    ("artifacts", "list"): ("artifact", "list"),
    ("artifacts", "get"): ("artifact", "download"),
}


def _options(args: tuple[str, ...]) -> list[str]:
    shown = runner.invoke(app, [*args, "--help"], terminal_width=200)
    assert shown.exit_code == 0, shown.output
    options = shown.output.split("─ Options ─", 1)[1].split("╰", 1)[
        0
    ]  # its own options, not its subcommands' help
    return sorted(set(re.findall(r"(?<![\w-])--[a-z][a-z-]+", options)))


@pytest.mark.parametrize("old, new", list(ALIASES.items()), ids=[" ".join(old) for old in ALIASES])
def test_an_older_spelling_is_the_same_command_as_the_new_one(old: tuple[str, ...], new: tuple[str, ...]):
    assert _options(old) == _options(new)


def test_the_older_spellings_are_left_out_of_help_and_every_listed_command_is_noun_then_verb():
    shown = runner.invoke(app, ["--help"], terminal_width=200).output
    listed = re.findall(r"^│ (\w[\w-]*) ", shown, re.M)
    assert listed == [
        "job",
        "project",
        "queue",
        "agent",
        "region",
        "artifact",
        "cache",
        "dlq",
        "group",
        "delivery",
        "local",
        "stack",
        "aws",
        "console",
        "advise",  # the disaster drill is relevo-tools' (`relevo-tools drill`), not the operator's
    ], shown
    job = runner.invoke(app, ["job", "--help"], terminal_width=200).output
    assert re.findall(r"^│ (\w[\w-]*) ", job, re.M) == [
        "list",
        "view",
        "logs",
        "tests",
        "watch",
        "approve",
        "reject",
        "cancel",
        "rerun",
        "promote",
        "release",
        "resolve",
        "priority",
        "delete",
    ], job


def test_version_names_the_cli_and_what_it_runs_with():
    shown = runner.invoke(app, ["--version"])
    assert shown.exit_code == 0
    assert shown.output.strip() == (
        f"relevo {metadata.version('relevo-cli')} (relevo-core {metadata.version('relevo-core')}, "
        f"relevo-agent {metadata.version('relevo-agent')})"
    )


@pytest.mark.parametrize(
    "args", [(), ("job", "list"), ("job", "logs"), ("local", "agent"), ("job", "resolve")]
)
def test_help_shows_no_type_tags(args: tuple[str, ...]):
    shown = runner.invoke(app, [*args, "--help"], terminal_width=200).output
    assert not re.search(r"<(bool|str|int|float|path|int range)>|\[x>=|<=x", shown), shown
    if args == ("job", "resolve"):
        assert "<succeeded|retry|failed>" in shown  # a choice keeps what to type
