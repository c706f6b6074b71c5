"""`relevo project apply`: a project file in, secrets to Secrets Manager, the project to the API."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from botocore.exceptions import ClientError
from pydantic import BaseModel, ConfigDict, Field

from relevo_cli.api import RelevoApi
from relevo_core.aws import client
from relevo_core.stackfile import StackInfo


class WebhookSecretSources(BaseModel):
    """Environment variables the CLI reads secret values from; the file never holds a secret."""

    model_config = ConfigDict(extra="forbid")

    github_secret_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    gitlab_token_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")


def secret_name(stack: StackInfo, project_id: str, kind: str) -> str:
    # The webhook function may read only secrets under relevo/<stack>/ (see template.yaml).
    return f"relevo/{stack.stack_name}/{project_id}/{kind}"


def _store_secret(name: str, value: str) -> str:
    secrets = client("secretsmanager")
    try:
        return secrets.create_secret(Name=name, SecretString=value)["ARN"]
    except ClientError as exc:
        if exc.response["Error"]["Code"] != "ResourceExistsException":
            raise
        return secrets.put_secret_value(SecretId=name, SecretString=value)["ARN"]


def load_project_file(path: Path) -> dict[str, Any]:
    document = yaml.safe_load(path.read_text())
    if not isinstance(document, dict):
        raise ValueError(f"{path}: a project file is a YAML mapping")
    return document


def apply_project_file(stack: StackInfo, api: RelevoApi, path: Path) -> dict[str, Any]:
    document = load_project_file(path)
    sources = WebhookSecretSources.model_validate(document.pop("webhook", None) or {})
    project_id = str(document.get("id", ""))
    references: dict[str, str] = {}
    for field, kind, ref_name in (
        (sources.github_secret_env, "github", "github_secret_ref"),
        (sources.gitlab_token_env, "gitlab", "gitlab_token_ref"),
    ):
        if field is None:
            continue
        value = os.environ.get(field)
        if not value:
            raise ValueError(f"webhook secret: environment variable {field} is not set")
        name = secret_name(stack, project_id, kind)
        _store_secret(name, value)
        references[ref_name] = name
    document["webhook"] = references
    return api.put_project(project_id, document)
