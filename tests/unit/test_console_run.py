"""The run page (issue 18, point 1) lists only the projects the caller may run (`operate` or more,
as the API matches the project's grants): a project the caller can only view, or not at all, is
neither offered nor counted among the groups."""

from __future__ import annotations

import re
from typing import Any

import boto3
from starlette.testclient import TestClient

from relevo_cli.api import ApiError, RelevoApi
from relevo_cli.console.app import create_app
from relevo_cli.console.security import ConsoleSecrets
from relevo_cli.console.state import Console
from tests.helpers.stack_files import UNREACHABLE

PORT = 8765
ORIGIN = f"http://127.0.0.1:{PORT}"
CALLER = "arn:aws:iam::123456789012:user/ana"
PROJECTS = [
    {"id": "ios-app", "group": "mobile", "default_ref": "main", "stages": [{"name": "build"}]},
    {"id": "android-app", "group": "android", "default_ref": "main", "stages": [{"name": "build"}]},
    {"id": "tools", "group": "infra", "default_ref": "main", "stages": [{"name": "build"}]},
    {"id": "billing", "default_ref": "main", "stages": [{"name": "build"}]},
]


class GrantedApi(RelevoApi):
    """GET /projects and each project's grants: the caller's level per project (None: no grant,
    the grants route refuses)."""

    def __init__(self, levels: dict[str, str | None]) -> None:
        super().__init__(f"{UNREACHABLE}/v1", "us-east-1", boto3.session.Session(region_name="us-east-1"))
        self.levels = levels

    def list_projects(self) -> dict[str, Any]:
        return {"projects": PROJECTS}

    def grants(self, project_id: str) -> dict[str, Any]:
        level = self.levels.get(project_id)
        if level is None:
            raise ApiError(
                403,
                {"error": "FORBIDDEN", "message": f"{CALLER} has no view permission on project {project_id}"},
            )
        return {"grants": [{"principal": CALLER, "level": level}]}


def _run_page(levels: dict[str, str | None], query: str = "") -> str:
    secrets_ = ConsoleSecrets()
    client = TestClient(
        create_app(Console(GrantedApi(levels), caller=lambda: CALLER), secrets_, PORT),
        base_url=ORIGIN,
        follow_redirects=False,
    )
    assert client.get(f"/?token={secrets_.token}").status_code == 303
    page = client.get(f"/run{query}")
    assert page.status_code == 200
    return page.text


def _options(html: str, select_id: str) -> list[str]:
    select = re.search(rf'<select id="{select_id}"[^>]*>(.*?)</select>', html, re.S).group(1)
    return re.findall(r'<option value="([^"]*)"', select)


def test_the_run_page_offers_only_the_projects_the_caller_may_operate():
    levels = {"ios-app": "operate", "android-app": "view", "tools": "manage", "billing": None}
    html = _run_page(levels)
    assert _options(html, "run-project") == ["ios-app", "tools"]
    assert _options(html, "run-group") == [
        "",
        "infra",
        "mobile",
    ]  # "all groups", then the runnable ones' groups
    assert "android" not in html and "billing" not in html
    # Asked for by name, a project the caller can only view is not selected: the first runnable one is
    html = _run_page(levels, "?project=android-app")
    assert re.search(r'<option value="ios-app" selected>', html) and "android-app" not in html


def test_a_caller_who_may_only_view_is_told_running_needs_operate():
    html = _run_page({"ios-app": "view", "android-app": "view", "tools": "view", "billing": None})
    assert "You may run no project: running one needs <code>operate</code> on it." in html
    assert 'id="run-form"' not in html
