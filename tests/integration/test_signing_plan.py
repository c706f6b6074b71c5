"""A project's signing settings (issue 20) at the API: refs outside the project's own
relevo/<stack>/_signing/<region_affinity>/<project>/ are refused (422 VALIDATION_FAILED, nothing
stored), and a job freezes the settings it was enqueued with, like `requires`."""

from __future__ import annotations

import json
import secrets

import pytest

from relevo_cli.api import ApiError, RelevoApi
from relevo_core.store.jobs import get_envelope


def _project(project_id: str, stack_name: str, region: str = "eu-west") -> dict:
    prefix = f"relevo/{stack_name}/_signing/{region}/{project_id}"
    return {
        "repo": f"acme/{project_id}",
        "region_affinity": "eu-west",
        "stages": [{"name": "sign", "run": "true"}],
        "signing": {
            "keychain": "temporary",
            "identities": [{"p12_ref": f"{prefix}/a.p12", "passphrase_ref": f"{prefix}/a.pass"}],
        },
    }


def test_signing_refs_outside_the_projects_prefix_are_refused_and_a_job_freezes_its_settings(local_stack):
    api = RelevoApi.for_stack(local_stack)
    project_id = f"sign-{secrets.token_hex(3)}"
    with pytest.raises(ApiError) as refused:
        api.put_project(project_id, _project(project_id, local_stack.stack_name, region="us-east"))
    assert (refused.value.status, refused.value.code) == (422, "VALIDATION_FAILED")
    assert "is not under relevo/<stack>/_signing/eu-west/" in refused.value.body["message"]
    assert project_id not in json.dumps(api.list_projects())  # nothing stored

    api.put_project(project_id, _project(project_id, local_stack.stack_name))
    job_id = api.run_project(project_id, {"ref": "main"})["job_id"]
    # The project changes afterwards: the job keeps what it was enqueued with.
    changed = _project(project_id, local_stack.stack_name)
    changed.pop("signing")
    api.put_project(project_id, changed)
    frozen = get_envelope(local_stack.table_name, job_id).signing
    assert (
        frozen is not None
        and frozen.identities[0].p12_ref
        == f"relevo/{local_stack.stack_name}/_signing/eu-west/{project_id}/a.p12"
    )
    later = api.run_project(project_id, {"ref": "main", "commit": "a" * 40})["job_id"]
    assert get_envelope(local_stack.table_name, later).signing is None
    for job in (job_id, later):
        api.cancel_job(job)
