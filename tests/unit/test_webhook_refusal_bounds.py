"""The webhook intake's cheap front door (issue 29): what it reads of a project before the project
is a model, what it names of a delivery, and how often a refusal may be stored.

Given the pieces receive.py uses before a delivery is verified, when they are fed a project, a
delivery's headers and a flood of refusals, then the secret's name is the model's, nothing of the
body or a secret is named, and a project's refusals are stored once a minute per container.
"""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

from relevo_core.intake.project_cache import CachedProject
from relevo_core.intake.webhooks.incoming import IncomingDelivery
from relevo_core.intake.webhooks.refusals import RefusalMinutes
from relevo_core.models.project import Project

ROOT = Path(__file__).resolve().parents[2]
DECLARATION = {
    "id": "ios-app",
    "repo": "acme/ios-app",
    "region_affinity": "eu-west",
    "stages": [{"name": "build", "run": "make"}],
}


def test_the_secret_name_read_from_the_stored_document_is_the_models():
    for webhook in (
        {"github_secret_ref": "relevo/s/ios-app/github"},
        {"gitlab_token_ref": "relevo/s/ios-app/gitlab"},
        {},
    ):
        project = Project.model_validate({**DECLARATION, "webhook": webhook})
        cached = CachedProject(project.model_dump(mode="json"))  # as store.projects.put_project stores it
        assert cached.webhook_secret_ref("github_secret_ref") == project.webhook.github_secret_ref
        assert cached.webhook_secret_ref("gitlab_token_ref") == project.webhook.gitlab_token_ref
        assert cached.project == project


def test_a_delivery_is_named_by_its_headers_never_its_body():
    lower = {
        "x-github-event": "push" * 40,
        "x-github-delivery": "d" * 500,
        "x-hub-signature-256": "sha256=" + "f" * 64,
    }
    delivery = IncomingDelivery.read(
        "github", "../etc", lower, "x-github-event", "x-github-delivery", 2_000_000
    )
    fields = delivery.fields()
    assert fields == {
        "source": "github",
        "project": None,
        "event": ("push" * 40)[:64],
        "delivery_id": "d" * 128,
        "body_bytes": 2_000_000,
    }
    assert "f" * 64 not in str(fields)
    assert (
        IncomingDelivery.read("github", "ios-app", {}, "x-github-event", "x-github-delivery", 0).fields()[
            "event"
        ]
        == "unknown"
    )


def test_a_project_s_refusals_are_stored_once_a_minute_per_container():
    now = datetime(2026, 12, 1, 10, 15, 5, tzinfo=UTC)
    minutes = RefusalMinutes(clock=lambda: now)
    assert minutes.due("t", "ios-app")
    assert [minutes.take("t", "ios-app", now + timedelta(seconds=s)) for s in (0, 1, 54)] == [
        True,
        False,
        False,
    ]
    assert not minutes.due("t", "ios-app")
    assert minutes.take("t", "android-app", now)  # each project its own minute
    assert minutes.take("t", "ios-app", now + timedelta(seconds=55))  # 10:16:00, the next minute
    minutes.clear()
    assert minutes.take("t", "ios-app", now + timedelta(seconds=55))  # a new container knows nothing


def test_verifying_a_delivery_imports_no_model_of_the_project_the_payload_or_the_job():
    """What the handler imports at its cold start: refusing a delivery needs nothing more."""
    probe = (
        "import sys, handler; print(sorted(m for m in sys.modules if "
        "m.startswith(('relevo_core.models.project', "
        "'relevo_core.models.envelope', 'relevo_core.models.plan', 'relevo_core.intake.webhooks.github', "
        "'relevo_core.intake.webhooks.gitlab', 'relevo_core.intake.enqueue', 'relevo_core.store.jobs', "
        "'relevo_core.store.job_creation'))))"
    )
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": f"{ROOT / 'layers' / 'core'}:{ROOT / 'functions' / 'webhook'}",
    }
    ran = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "[]"
