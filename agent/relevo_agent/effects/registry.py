"""Which class performs each built-in kind (relevo_core.models.effect's `kind`): one line per kind,
each made from its declaration and the stage's plan (whose aws_profile the s3_object kind uses)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from relevo_agent.effects.kind import EffectKind
    from relevo_core.models.plan import StagePlan


def _s3_object(spec: Any, plan: StagePlan) -> EffectKind:
    from relevo_agent.effects.s3_object import S3ObjectEffect

    return S3ObjectEffect.with_profile(spec, plan.aws_profile)


# kind name -> its maker. A kind's module is imported only when a stage declares it.
KINDS: dict[str, Callable[[Any, StagePlan], EffectKind]] = {
    "s3_object": _s3_object,
}


class UnknownKind(Exception):
    """A kind this agent cannot perform (its module is not in this agent)."""


def kind_for(plan: StagePlan) -> EffectKind:
    """The kind that performs the plan's effect. Raises UnknownKind."""
    assert plan.effect is not None
    make = KINDS.get(plan.effect.kind)
    if make is None:
        raise UnknownKind(
            f"this agent cannot perform an effect of kind {plan.effect.kind} (it performs "
            f"{', '.join(sorted(KINDS))}): upgrade relevo-agent"
        )
    return make(plan.effect, plan)
