"""Safe by default: a gateway other hosts can reach must ask for an API key, unless an open endpoint is intended.

The address checked is where clients reach the gateway: LLMFLEET_PUBLISHED_HOST when a container runtime or a
proxy publishes it (docker-compose.yml binds 0.0.0.0 inside the container and publishes on 127.0.0.1), else
the bind address LLMFLEET_HOST. Loopback (127.0.0.0/8, ::1, localhost) is always fine. Anything else needs a key
(LLMFLEET_API_KEY or LLMFLEET_KEYS_FILE; an empty key file refuses every request, which is closed, not open) or
LLMFLEET_ALLOW_OPEN=1 (`--allow-open`), which starts it with a warning in the log. The check runs where a
gateway process starts (`llmfleet gateway`, `llmfleet serve`, `python -m gateway`), before it listens.
"""

from __future__ import annotations

import ipaddress

from shared.settings import Settings, SettingsError

LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost")


class OpenEndpointRefused(SettingsError):
    """The gateway would serve the network with no API key, and no setting says that is intended."""


def is_loopback(host: str) -> bool:
    """Whether `host` is reachable from this machine only (a loopback address or localhost)."""
    name = host.strip().strip("[]").lower()
    if name in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False  # a host name or an interface's address: other hosts may reach it


def check_exposure(settings: Settings) -> str | None:
    """None when the gateway is loopback-only or needs a key; the warning to log when it serves the network
    without a key by choice (LLMFLEET_ALLOW_OPEN=1); raises OpenEndpointRefused, saying why and what to do,
    otherwise."""
    host = settings.published_host or settings.host
    if is_loopback(host) or settings.api_key is not None or settings.keys_file:
        return None
    where = f"{host}:{settings.port}" + (" (LLMFLEET_PUBLISHED_HOST)" if settings.published_host else "")
    if settings.allow_open:
        return (f"serving {where} with no API key (LLMFLEET_ALLOW_OPEN=1): anyone who can reach this address "
                "can use the models; set LLMFLEET_API_KEY or LLMFLEET_KEYS_FILE to require a key")
    raise OpenEndpointRefused(
        f"refusing to serve {where} with no API key: anyone who can reach this address could use the models. "
        "Set LLMFLEET_API_KEY (or LLMFLEET_KEYS_FILE, see `llmfleet keys`) to require a key, or listen on "
        "127.0.0.1 (--host 127.0.0.1), or, if an open endpoint is intended (e.g. behind a proxy that "
        "authenticates), set LLMFLEET_ALLOW_OPEN=1 (--allow-open)."
    )
