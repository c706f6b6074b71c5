"""The built-in release effects (relevo_core.models.effect, docs/release-effects.md): what the agent
does itself for a stage that declares `effect: {kind: …}`, in place of a command. Every kind follows
relevo_agent.effects.kind: it records the identifiers of its effect before the effect can have
happened, probes by what Apple or the host really keeps, and resumes rather than redoes."""
