"""A stage's built-in release effect as the people who ship see it (docs/release-effects.md): its
kind, the identifiers its kind recorded (relevo_agent.effects: the stage's values), Apple's state
and a line in words -- "uploaded build 42 (VALID)", "notarized (Accepted, submission 2efe41c0…)".

Derived from what is already read, never a call of its own: the stage's plan (its effect's kind)
and its recorded values, plus, for a stage held for review, its reconciliation's evidence. The job
view (GET /jobs/{id}), `relevo job view`, the console, the notifications and the commit status say
the same line."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from relevo_core.models.status import SUCCEEDED_STAGE, StageStatus

# What each kind records, in the order a person reads them (relevo_agent.effects.<kind>).
IDENTIFIERS = {
    "app_store_upload": ("app_id", "build_version", "build_number", "upload_id", "build_id", "sha256"),
    "notarization": ("submission_id", "submission_name", "sha256", "stapled"),
    "github_release_asset": ("repository", "tag", "asset_name", "asset_id", "asset_url", "sha256"),
    "s3_object": ("s3_uri", "etag", "version_id", "sha256"),
}
# Apple's state, as the Apple kinds record it (an upload's or build's state, a submission's status).
STATE = "apple_state"
# An id in a line: its first characters, enough to find it in the full list of the view.
SHORT_ID = 8
# Apple's ends: App Store Connect's build upload and build processing, the Notary API's status.
_UPLOAD_DONE = frozenset({"VALID"})
_UPLOAD_REJECTED = frozenset({"FAILED", "INVALID"})
_NOTARY_DONE = "Accepted"


class EffectSummary(BaseModel):
    """A stage's built-in effect: what it is, what identifies it at Apple or the host, where it
    stands there."""

    model_config = ConfigDict(extra="allow")

    kind: str = Field(
        description="the effect's kind: app_store_upload, notarization, github_release_asset, s3_object"
    )
    identifiers: dict[str, str] = Field(
        {},
        description="what the effect recorded of itself so far (before it could have happened, then as "
        "Apple or the host answered): upload_id, build_number, submission_id, asset_id, sha256, …",
    )
    state: str | None = Field(
        None,
        description="Apple's state as last recorded: a build upload's or build's (AWAITING_UPLOAD, "
        "PROCESSING, VALID, FAILED), a submission's (In Progress, Accepted, Invalid, Rejected)",
    )
    words: str = Field(
        description='the effect in a line: "uploaded build 42 (VALID)", '
        '"notarized (Accepted, submission 2efe41c0…)"'
    )
    evidence: str | None = Field(
        None,
        description="held for review (manual_review): what the reconcile's probe found, as its evidence says",
    )


def short(identifier: str) -> str:
    return identifier if len(identifier) <= SHORT_ID else identifier[:SHORT_ID] + "…"


def effect_words(kind: str, values: Mapping[str, str]) -> str:
    """The effect in a line, from its recorded values alone (none yet: "not uploaded yet")."""
    state = values.get(STATE)
    if kind == "app_store_upload":
        build = f"build {values['build_number']}" if values.get("build_number") else "the build"
        if not values.get("upload_id"):
            return f"{build} not uploaded yet"
        if state in _UPLOAD_DONE:
            return f"uploaded {build} ({state})"
        if state in _UPLOAD_REJECTED:
            return f"upload of {build} {state}"
        return f"uploading {build} ({state or 'state not read yet'})"
    if kind == "notarization":
        submission = values.get("submission_id")
        if not submission:
            return "notarization not submitted yet"
        if state == _NOTARY_DONE:
            stapled = ", stapled" if values.get("stapled") == "true" else ""
            return f"notarized ({state}, submission {short(submission)}{stapled})"
        return f"notarization {state or 'submitted'} (submission {short(submission)})"
    if kind == "github_release_asset":
        name = values.get("asset_name") or "the asset"
        tag = f" to {values['tag']}" if values.get("tag") else ""
        if values.get("asset_id"):
            return f"attached {name}{tag} (asset {values['asset_id']})"
        return f"{name} not attached{tag} yet"
    if kind == "s3_object":
        where = values.get("s3_uri") or "the object"
        return f"put {where}" if values.get("etag") else f"{where} not put yet"
    return kind


def effect_summary(
    kind: str | None,
    outputs: Mapping[str, str],
    status: str | None = None,
    reconciled: Mapping[str, Any] | None = None,
    reused_from: str | None = None,
) -> dict[str, Any] | None:
    """The summary of a stage whose plan declares an effect of `kind` (None: no effect, no summary),
    from its recorded `outputs`; `status` and `reconciled` (the stage's latest reconciliation) give
    the evidence of a stage held for review. A stage a rerun did not run again (`reused_from`: the
    job it reran) has its effect in that job: said so, not read from there."""
    if kind is None:
        return None
    identifiers = {key: outputs[key] for key in IDENTIFIERS.get(kind, ()) if outputs.get(key)}
    evidence = None
    if status == StageStatus.MANUAL_REVIEW.value and isinstance(reconciled, Mapping):
        given = reconciled.get("evidence")
        found = given if isinstance(given, Mapping) else {}
        evidence = str(found.get("probe_output") or found.get("why") or "") or None
    summary = EffectSummary(
        kind=kind,
        identifiers=identifiers,
        state=outputs.get(STATE) or None,
        words=(
            f"done in {reused_from} (not run again)"
            if reused_from and not outputs
            else effect_words(kind, outputs)
        ),
        evidence=evidence,
    )
    return summary.model_dump(mode="json")


def stage_values(record: Mapping[str, Any]) -> dict[str, str]:
    """A stage record's $RELEVO_OUTPUT values: its receipt's once it succeeded, else as recorded so far."""
    given = record.get("receipt")
    receipt = given if isinstance(given, dict) else {}
    outputs = (
        receipt.get("outputs")
        if record.get("status") in SUCCEEDED_STAGE and "outputs" in receipt
        else record.get("outputs")
    )
    return (
        {str(key): str(value) for key, value in (outputs or {}).items()} if isinstance(outputs, dict) else {}
    )
