"""Which Macs a job's next stage is offered to before any Mac of the region takes it (the claim
route answers PREVIOUS_AGENT_PREFERRED naming them; the agent passes the stage on to the first of
them that waits for work, for at most its prefer_previous_sec: relevo_agent.placement).

Best first: the Mac that ran the stage before, when files wait there (it handed some on or
restored some: store/stood_on.holds_files); then, for a stage that declares caches, the Macs that
most recently saved or restored an entry of those caches in the job's region (store.cache_holders):
their content cache likely holds its bytes, so its restore downloads little or nothing. The key a
stage restores is rendered on the Mac (its lock files, its Xcode), so it is not known before the
claim; the cache's name is, and a Mac that restored any entry of it lately holds most of what the
next one restores (docs/caches.md, "Placement").
"""

from __future__ import annotations

from botocore.exceptions import BotoCoreError, ClientError

from relevo_core.models.cache import cache_scope
from relevo_core.models.envelope import JobEnvelope
from relevo_core.observability import logger
from relevo_core.store import cache_holders

# The cache holders offered after the previous stage's Mac: the most recent ones.
MAX_CACHE_MACS = 3


def ranked(previous_agent: str | None, holders: dict[str, str], agent_id: str) -> list[str]:
    """The Macs better placed than `agent_id` for the stage, best first (empty: it takes the stage).
    `holders`: each Mac that saved or restored an entry of the stage's caches, with when."""
    recent = sorted(holders, key=lambda name: (holders[name], name), reverse=True)[:MAX_CACHE_MACS]
    better: list[str] = []
    for name in ([previous_agent] if previous_agent else []) + recent:
        if name == agent_id:
            break  # this Mac holds as much as the rest: it takes the stage
        if name not in better:
            better.append(name)
    return better


def cache_macs(table: str, envelope: JobEnvelope, stage_index: int) -> dict[str, str]:
    """The Macs that recently saved or restored an entry of the caches the stage declares, with
    when; none when it declares none, or when they cannot be read (a placement hint never fails a
    claim)."""
    names = [spec.name for spec in envelope.stages[stage_index].caches]
    if not names:
        return {}
    try:
        return cache_holders.recent_holders(
            table, cache_scope(envelope.project, envelope.region_affinity), names
        )
    except (BotoCoreError, ClientError) as exc:
        logger.warning("the Macs holding the stage's caches could not be read", extra={"error": str(exc)})
        return {}
