"""`relevo project delete` and DELETE /projects/{id}: refused while a job of the project is live
(nothing deleted), then the schedules, grants, declaration and webhook secrets go; the id can be
applied again."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from relevo_cli.api import ApiError, RelevoApi
from relevo_cli.main import app
from relevo_cli.projects import secret_name
from relevo_core.aws import client
from tests.helpers.stack import job_items, register_project, table_items

runner = CliRunner()


def test_a_project_is_deleted_once_no_job_of_it_is_live(local_stack, project_id, tmp_path: Path):
    stack_file = tmp_path / "stack.json"
    stack_file.write_text(json.dumps(local_stack.model_dump()))
    register_project(local_stack, project_id, [{"name": "build", "run": "make"}], queue_timeout_sec=600)
    api = RelevoApi.for_stack(local_stack)
    job_id = api.run_project(project_id, {"ref": "main"})["job_id"]

    # While its job is live: refused, naming the job, and nothing is deleted
    refused = runner.invoke(app, ["project", "delete", project_id, "--yes", "--stack-file", str(stack_file)])
    assert refused.exit_code == 1
    assert "409 PROJECT_HAS_LIVE_JOBS" in refused.output and job_id in refused.output, refused.output
    assert api.get_project(project_id)["id"] == project_id

    # Once it ended: the project, its grants and its webhook secret are gone; its job stays
    api.cancel_job(job_id)
    deleted = runner.invoke(app, ["project", "delete", project_id, "--yes", "--stack-file", str(stack_file)])
    assert deleted.exit_code == 0, deleted.output
    assert deleted.output.startswith(
        f"project {project_id} deleted with 0 schedule(s), 1 grant(s), secret "
        f"{secret_name(local_stack, project_id, 'github')}"
    )
    try:
        api.get_project(project_id)
        raise AssertionError("the project is still there")
    except ApiError as exc:
        # Its grants went with it: this caller (no admin of this stack) may not learn it is missing.
        assert (exc.status, exc.code) in ((404, "PROJECT_NOT_FOUND"), (403, "FORBIDDEN")), exc
    assert project_id not in [p["id"] for p in api.list_projects()["projects"]]
    assert table_items(local_stack, f"PROJECT#{project_id}") == []
    [job] = [item for item in job_items(local_stack, job_id) if item["sk"]["S"] == "JOB"]
    assert job["status"]["S"] == "canceled"
    names = [s["Name"] for s in client("secretsmanager").list_secrets()["SecretList"]]
    assert secret_name(local_stack, project_id, "github") not in names

    # And the same id can be applied again
    register_project(local_stack, project_id, [{"name": "build", "run": "make"}])
    assert api.get_project(project_id)["id"] == project_id


def test_deleting_a_project_needs_manage_and_a_refusal_deletes_nothing(local_stack, project_id):
    import secrets

    from tests.helpers.iam import iam_user

    register_project(local_stack, project_id, [{"name": "build", "run": "make"}])
    owner = RelevoApi.for_stack(local_stack)
    operator = iam_user(local_stack, f"operator-{secrets.token_hex(3)}")
    owner.grant(project_id, operator.arn, "operate")
    before = table_items(local_stack, f"PROJECT#{project_id}")
    try:
        operator.api.delete_project(project_id)
        raise AssertionError("an operator deleted the project")
    except ApiError as exc:
        assert (exc.status, exc.code) == (403, "FORBIDDEN") and "this needs manage" in str(exc), exc
    assert table_items(local_stack, f"PROJECT#{project_id}") == before
