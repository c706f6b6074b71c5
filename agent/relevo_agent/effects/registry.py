"""Which class performs each built-in kind (relevo_core.models.effect's `kind`): one line per kind,
each made from its declaration and the stage's plan (whose aws_profile the s3_object kind uses).
A kind's module is imported only when a stage declares it."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from relevo_agent.config import ReleaseEndpoints
    from relevo_agent.effects.kind import EffectKind
    from relevo_core.models.plan import StagePlan

# A kind made from its declaration, the stage's plan and the agent's release_endpoints.
Maker = Callable[[Any, "StagePlan", "ReleaseEndpoints"], "EffectKind"]


class UnknownKind(Exception):
    """A kind this agent cannot perform (its module is not in this agent)."""


def _by_name(module: str, name: str) -> Maker:
    """The class `name` of relevo_agent.effects.`module`, made from the declaration alone."""

    def make(spec: Any, plan: StagePlan, endpoints: ReleaseEndpoints) -> EffectKind:
        try:
            found = getattr(importlib.import_module(f"relevo_agent.effects.{module}"), name)
        except (ImportError, AttributeError) as missing:
            raise UnknownKind(f"{module}.{name} is not in this agent ({missing})") from None
        kind: EffectKind = found(spec)
        return kind

    return make


def _s3_object(spec: Any, plan: StagePlan, endpoints: ReleaseEndpoints) -> EffectKind:
    from relevo_agent.effects.s3_object import S3ObjectEffect

    return S3ObjectEffect.with_profile(spec, plan.aws_profile)


def _app_store_upload(spec: Any, plan: StagePlan, endpoints: ReleaseEndpoints) -> EffectKind:
    """With the agent's poll interval, when its config sets one."""
    from relevo_agent.effects.app_store_upload import AppStoreUploadEffect

    if endpoints.poll_sec is None:
        return AppStoreUploadEffect(spec)
    return AppStoreUploadEffect(spec, poll_sec=endpoints.poll_sec)


def _notarization(spec: Any, plan: StagePlan, endpoints: ReleaseEndpoints) -> EffectKind:
    """With the agent's stapler, the upload endpoint (the local Apple service's in the demo) and
    its poll interval, when its config sets one."""
    from relevo_agent.effects.notarization import NotarizationEffect

    polled = {} if endpoints.poll_sec is None else {"poll_sec": endpoints.poll_sec}
    return NotarizationEffect(
        spec, stapler=endpoints.stapler, upload_endpoint=endpoints.notary_upload, **polled
    )


KINDS: dict[str, Maker] = {
    "app_store_upload": _app_store_upload,
    "notarization": _notarization,
    "github_release_asset": _by_name("github_release_asset", "GithubReleaseAssetEffect"),
    "s3_object": _s3_object,
}


def kind_for(plan: StagePlan, endpoints: ReleaseEndpoints) -> EffectKind:
    """The kind that performs the plan's effect. Raises UnknownKind."""
    assert plan.effect is not None
    make = KINDS.get(plan.effect.kind)
    if make is None:
        raise UnknownKind(
            f"this agent cannot perform an effect of kind {plan.effect.kind} (it performs "
            f"{', '.join(sorted(KINDS))}): upgrade relevo-agent"
        )
    try:
        return make(plan.effect, plan, endpoints)
    except UnknownKind as unknown:
        raise UnknownKind(
            f"this agent cannot perform an effect of kind {plan.effect.kind}: {unknown}; upgrade relevo-agent"
        ) from None
