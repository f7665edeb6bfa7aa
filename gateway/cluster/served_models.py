"""Which models the deployment serves: the required ones (the node agents' pinned models and
LLMFLEET_REQUIRED_MODELS, what /ready waits for: gateway/admin/readiness.py), and the ones a request without
`model` may mean (gateway/replies/request_body.py)."""

from __future__ import annotations

from gateway.cluster.registry import Registry
from gateway.cluster.warm_pool import WarmPool
from shared.settings import Settings


def required_models(settings: Settings, pinned: set[str]) -> set[str]:
    """LLMFLEET_REQUIRED_MODELS and the node agents' pinned models."""
    return {name.strip() for name in settings.required_models.split(",") if name.strip()} | pinned


async def default_models(registry: Registry, pool: WarmPool, settings: Settings) -> list[str]:
    """The models a request without `model` may mean: those served now, else the required or catalogued ones
    (a request queued for a model still loading is served once it is)."""
    live = sorted(await registry.live_models())
    if live:
        return live
    nodes = await pool.nodes()
    required = required_models(settings, {m for node in nodes for m in node.pinned})
    return sorted(required or {m for node in nodes for m in node.catalogue})
