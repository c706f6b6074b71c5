"""A project file (YAML) as `relevo project apply` reads it: parsed with positions, validated with
the same model the API uses, and every mistake reported as `FILE:LINE: field: what is wrong`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

from relevo_core.files.user_written import (
    FileMistake,
    InvalidFile,
    Loc,
    Locator,
    field_name,
    read_text,
    validate,
)
from relevo_core.fleet.lease_timeline import infeasible_lease
from relevo_core.models.project import Project

ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"


class WebhookSecretSources(BaseModel):
    """Environment variables the CLI reads secret values from; the file never holds a secret."""

    model_config = ConfigDict(extra="forbid", title="WebhookSecretSources")

    github_secret_env: str | None = Field(
        default=None,
        pattern=ENV_NAME,
        description="Environment variable holding the GitHub webhook secret. `relevo project apply` stores "
        "its "
        "value in Secrets Manager (relevo/<stack>/<project>/github); only the reference is registered.",
    )
    gitlab_token_env: str | None = Field(
        default=None,
        pattern=ENV_NAME,
        description="Environment variable holding the GitLab webhook token (X-Gitlab-Token), stored the "
        "same way "
        "under relevo/<stack>/<project>/gitlab.",
    )


class ProjectFile(Project):
    """A project file: the registered project, except that `webhook` names environment variables
    holding the secrets rather than where they are stored."""

    model_config = ConfigDict(frozen=True, extra="forbid", title="Relevo project file")

    webhook: WebhookSecretSources = Field(  # type: ignore[assignment]  # the file: env variables
        default=WebhookSecretSources(),
        description="Where `relevo project apply` reads the webhook secrets from.",
    )


def _locator(root: yaml.Node | None) -> Locator:
    """Lines of a YAML document's values by pydantic `loc`: the key's line for a mapping entry, the
    item's line for a list item, and for something missing the line of the mapping that lacks it."""

    def locate(loc: Loc) -> int | None:
        node, line = root, (root.start_mark.line if root is not None else 0)
        for part in loc:
            if isinstance(node, yaml.MappingNode):
                entry = next(((k, v) for k, v in node.value if k.value == part), None)
                if entry is None:
                    break
                line, node = entry[0].start_mark.line, entry[1]
            elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
                node = node.value[part]
                line = node.start_mark.line
            else:
                break
        return line + 1

    return locate


def parse(path: Path, what: str = "project file") -> tuple[Any, Locator]:
    """The YAML document of `path` and a locator for its values; a syntax error names its line."""
    text = read_text(path, what)
    loader = yaml.SafeLoader(text)
    try:
        root = loader.get_single_node()
        document = loader.construct_document(root) if root is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = " ".join(part for part in (exc.context, exc.problem) if part) or "not valid YAML"
        raise InvalidFile.one(
            path,
            f"YAML syntax: {problem}",
            mark.line + 1 if mark else None,
            mark.column + 1 if mark else None,
        ) from exc
    except yaml.YAMLError as exc:
        raise InvalidFile.one(path, f"YAML syntax: {exc}") from exc
    finally:
        loader.dispose()
    return document, _locator(root)


@dataclass(frozen=True)
class LoadedProjectFile:
    path: Path
    # The mapping as written: what is sent to the API (which applies the defaults itself).
    document: dict[str, Any]
    project: ProjectFile
    locate: Locator

    def mistake(self, loc: Loc, message: str) -> InvalidFile:
        """A mistake found after validation (against the stack, the environment) at `loc`."""
        return InvalidFile([FileMistake(self.path, message, self.locate(loc), field=field_name(loc))])


def load_project_file(path: Path) -> LoadedProjectFile:
    """The file, validated; a lease no agent would take (relevo_core.fleet.lease_timeline: it depends on
    the lease and the agents' allowed clock skew, here their default) is a mistake of the file too."""
    document, locate = parse(path)
    if not isinstance(document, dict):
        raise InvalidFile.one(path, "a project file is a YAML mapping of keys (id:, repo:, stages:, ...)", 1)
    loaded = LoadedProjectFile(path, document, validate(ProjectFile, document, path, locate), locate)
    refused = infeasible_lease(loaded.project.lease_ttl_sec)
    if refused:
        raise loaded.mistake(("lease_ttl_sec",), refused)
    return loaded
