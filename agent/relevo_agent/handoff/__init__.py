"""The handoff: files one stage of a job leaves for the later ones, stored under the job's
artifact_uri and restored at the same paths on whichever Mac runs the next stage (docs/handoff.md).

    tree     what the declared paths hold, as manifest entries (never leaving the workspace)
    cache    this Mac's copies of handed-on files by sha256 (what makes a same-Mac restore 0 bytes)
    store    a stage's tree into packs, blobs and a manifest; their records fenced on the attempt
    restore  every earlier stage's manifest back into the workspace, each byte verified

Loaded only when a stage hands on or restores something: an idle agent never imports it.
"""

from __future__ import annotations

from relevo_core.models.errors import ErrorClass


class HandoffFailure(Exception):
    """The stage fails with `error_class`; the message says which path and why."""

    def __init__(self, error_class: ErrorClass, message: str) -> None:
        super().__init__(message)
        self.error_class = error_class
        self.message = message


class Stopped(Exception):
    """The stage was stopped (fenced, canceled, shut down) during the restore."""
