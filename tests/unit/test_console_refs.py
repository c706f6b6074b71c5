"""The run page's branch list: `git ls-remote` of the operator's own git, and where it looks."""

from __future__ import annotations

from pathlib import Path

from relevo_cli.console.refs import list_refs, remote_url
from tests.helpers.browser import git_remote


def test_branches_and_tags_are_listed_once_each(tmp_path: Path):
    bare = git_remote(tmp_path, "acme/app", ("main", "release/4.2"), ("v1.0.0",))
    listed = list_refs(f"file://{bare}")
    assert listed["error"] is None
    assert sorted((r["kind"], r["name"]) for r in listed["refs"]) == [
        ("branch", "main"),
        ("branch", "release/4.2"),
        ("tag", "v1.0.0"),
    ]


def test_a_repository_git_cannot_read_says_why_in_one_line_and_lists_nothing(tmp_path: Path):
    url = f"file://{tmp_path}/missing.git"
    listed = list_refs(url)
    assert listed["refs"] == []
    assert (
        listed["error"]
        == f"Could not list the branches: type a branch or tag (no repository at {url} that your git "
        "credentials can see)"
    )
    assert listed["detail"]  # git's own last line, for the tooltip


def test_an_unreachable_host_is_one_clear_line_not_git_s_fatal():
    # A name under .invalid never resolves (RFC 2606): what an offline laptop sees of github.com
    url = "https://github.invalid/acme/app.git"
    listed = list_refs(url)
    assert listed["refs"] == []
    assert listed["error"] in (
        "Could not list the branches: type a branch or tag (github.invalid could not be resolved: offline, "
        "or no DNS)",
        "Could not list the branches: type a branch or tag (github.invalid could not be reached)",
    ), listed
    assert "fatal" not in listed["error"]


def test_the_remote_is_the_projects_host_or_the_configured_base():
    assert remote_url({"repo": "acme/app"}, None) == "https://github.com/acme/app.git"
    assert (
        remote_url({"repo": "acme/app", "webhook": {"gitlab_token_ref": "s"}}, None)
        == "https://gitlab.com/acme/app.git"
    )
    assert (
        remote_url({"repo": "acme/app"}, "https://git.example.com/") == "https://git.example.com/acme/app.git"
    )
