"""`relevo project apply`: a project file in, secrets to Secrets Manager, the project to the API.

Everything that can be checked before writing is checked first (the file, the region's work
queue, the secrets' environment variables), so a refused apply writes nothing. The secrets are
then written, and if the API refuses the project, what this apply wrote is undone: a secret it
created is deleted, a secret it changed gets its previous value back."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from botocore.exceptions import ClientError

from relevo_cli.api import RelevoApi
from relevo_cli.project_file import LoadedProjectFile, load_project_file
from relevo_core.aws import client, error_code
from relevo_core.files.stack import StackInfo
from relevo_core.files.user_written import closest

__all__ = ["apply_loaded", "apply_project_file", "delete_secrets", "load_project_file", "secret_name"]


def secret_name(stack: StackInfo, project_id: str, kind: str) -> str:
    # The webhook function may read only secrets under relevo/<stack>/ (see template.yaml).
    return f"relevo/{stack.stack_name}/{project_id}/{kind}"


@dataclass(frozen=True)
class WrittenSecret:
    """A secret this apply wrote, and how to undo it: delete it (it did not exist) or put its
    previous value back."""

    name: str
    previous_value: str | None

    def undo(self) -> None:
        secrets = client("secretsmanager")
        if self.previous_value is None:
            # Without ForceDeleteWithoutRecovery the name stays reserved for the recovery window,
            # and the next apply could not create it again.
            secrets.delete_secret(SecretId=self.name, ForceDeleteWithoutRecovery=True)
        else:
            # A new version holding the previous value, rather than moving AWSCURRENT back with
            # UpdateSecretVersionStage (the user guide's "Roll back a secret"): moto 5.2.5 moves the
            # label but GetSecretValue keeps answering the newer version, so locally the webhook
            # would go on reading the value the refused apply wrote.
            secrets.put_secret_value(SecretId=self.name, SecretString=self.previous_value)


def _store_secret(name: str, value: str) -> WrittenSecret | None:
    """Create the secret or give it a new value; None when it already holds the value."""
    secrets = client("secretsmanager")
    try:
        secrets.create_secret(Name=name, SecretString=value)
        return WrittenSecret(name, None)
    except ClientError as exc:
        if error_code(exc) != "ResourceExistsException":
            raise
    previous = secrets.get_secret_value(SecretId=name)["SecretString"]
    if previous == value:
        return None
    secrets.put_secret_value(SecretId=name, SecretString=value)
    return WrittenSecret(name, previous)


def check_region(stack: StackInfo, loaded: LoadedProjectFile) -> None:
    """The project's region affinity must have a work queue in this stack, or no agent could ever
    take its stages (REGION_UNKNOWN at every run)."""
    region = loaded.project.region_affinity
    if region in stack.work_queues:
        return
    known = sorted(stack.work_queues)
    hint = closest(region, known)
    raise loaded.mistake(
        ("region_affinity",),
        f"{region!r} has no work queue in this stack{f' (did you mean {hint!r}?)' if hint else ''}; "
        f"its region affinities: {', '.join(known) or 'none'} (the stack's RegionAffinities)",
    )


def _secret_values(loaded: LoadedProjectFile) -> list[tuple[str, str, str]]:
    """(kind, reference field, value) of each webhook secret the file names; every variable must
    be set before anything is written."""
    webhook = loaded.project.webhook
    wanted = [
        ("github", "github_secret_ref", "github_secret_env", webhook.github_secret_env),
        ("gitlab", "gitlab_token_ref", "gitlab_token_env", webhook.gitlab_token_env),
    ]
    values = []
    for kind, reference, field, variable in wanted:
        if variable is None:
            continue
        value = os.environ.get(variable)
        if not value:
            raise loaded.mistake(
                ("webhook", field), f"environment variable {variable} is not set (it holds the secret)"
            )
        values.append((kind, reference, value))
    return values


def apply_project_file(stack: StackInfo, api: RelevoApi, path: Path) -> dict[str, Any]:
    return apply_loaded(stack, api, load_project_file(path))


def apply_loaded(stack: StackInfo, api: RelevoApi, loaded: LoadedProjectFile) -> dict[str, Any]:
    check_region(stack, loaded)
    values = _secret_values(loaded)
    project_id = loaded.project.id
    written: list[WrittenSecret] = []
    references: dict[str, str] = {}
    try:
        for kind, reference, value in values:
            name = secret_name(stack, project_id, kind)
            stored = _store_secret(name, value)
            if stored is not None:
                written.append(stored)
            references[reference] = name
        return api.put_project(project_id, {**loaded.document, "webhook": references})
    except BaseException:
        for secret in reversed(written):
            secret.undo()
        raise


def delete_secrets(stack: StackInfo, project_id: str) -> list[str]:
    """The webhook secrets `project apply` stored for the project (relevo/<stack>/<id>/github,
    gitlab), deleted without a recovery window so that the id can be applied again; the names
    of those there were."""
    secrets = client("secretsmanager")
    deleted = []
    for kind in ("github", "gitlab"):
        name = secret_name(stack, project_id, kind)
        try:
            secrets.delete_secret(SecretId=name, ForceDeleteWithoutRecovery=True)
        except ClientError as exc:
            if error_code(exc) != "ResourceNotFoundException":
                raise
            continue
        deleted.append(name)
    return deleted
