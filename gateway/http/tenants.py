"""Who a request is for, as fair shares count it (shared/fair_queue.py FAIR_SCRIPT): its tenant and weight.

With API keys on, the tenant is the key's name and its weight the key file's `weight` (1 by default); a client
cannot name another tenant. With keys off, it is the `X-LLMFleet-Tenant` header, else the body's `user` (OpenAI)
or `metadata.user_id` (Anthropic), else one tenant shared by every anonymous request, each of weight 1.
"""

from __future__ import annotations

import contextvars

from gateway.http.api_keys import current_key

TENANT_HEADER = "x-llmfleet-tenant"
ANONYMOUS = "-"
MAX_TENANT_CHARS = 256

requested_tenant: contextvars.ContextVar[str | None] = contextvars.ContextVar("requested_tenant", default=None)


def note_requested(name: str | None) -> None:
    """Record the tenant a request names (its header first, then its body's user field); the first one stays."""
    if name and requested_tenant.get() is None:
        requested_tenant.set(name[:MAX_TENANT_CHARS])


def current_tenant() -> tuple[str, float]:
    """(tenant, weight) of the request being served."""
    key = current_key.get()
    if key is not None:
        return key.name, key.weight
    return requested_tenant.get() or ANONYMOUS, 1.0
