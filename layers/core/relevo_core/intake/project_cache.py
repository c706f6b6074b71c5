"""Projects as the webhook intake holds them: read at most once per PROJECT_CACHE_SEC per
container, so a warm delivery reads no project at all; kept as stored, and read into the model
(the Project and its run plan's models) only when a verified delivery needs it, so that verifying
a delivery, or refusing one, builds none of them."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from relevo_core.store.projects import get_project_document

if TYPE_CHECKING:
    from relevo_core.models.project import Project


class CachedProject:
    """A project's stored document, and the Project made of it on first need."""

    def __init__(self, document: dict[str, Any]) -> None:
        self.document = document
        self._project: Project | None = None

    def webhook_secret_ref(self, name: str) -> str | None:
        """`webhook.<name>` (github_secret_ref, gitlab_token_ref: Project.webhook's fields) as stored."""
        webhook = self.document.get("webhook")
        value = webhook.get(name) if isinstance(webhook, dict) else None
        return value if isinstance(value, str) and value else None

    @property
    def project(self) -> Project:
        if self._project is None:
            from relevo_core.models.project import Project

            self._project = Project.model_validate(self.document)
        return self._project


class ProjectCache:
    """Projects read at most once per `max_age` per container: the warm path stays at two calls.

    A project change reaches webhooks within max_age; a job already queued never changes, since
    its plan is frozen in the envelope.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock  # monotonic; a test holds it to keep a container warm on a slow host
        self._lock = threading.Lock()
        self._entries: dict[tuple[str, str], tuple[float, CachedProject]] = {}

    def get(self, table: str, project_id: str, max_age: float) -> CachedProject:
        now = self.clock()
        with self._lock:
            cached = self._entries.get((table, project_id))
        if cached and now - cached[0] < max_age:
            return cached[1]
        project = CachedProject(get_project_document(table, project_id))
        with self._lock:
            self._entries[(table, project_id)] = (now, project)
        return project

    def read_at(self, table: str, project_id: str) -> float | None:
        """When (on `clock`) this container last read the project; None if it never has.
        Reads nothing: a project it returns a time for existed then."""
        with self._lock:
            cached = self._entries.get((table, project_id))
        return cached[0] if cached else None

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


project_cache = ProjectCache()
