"""Run the gateway: `python -m gateway` (settings from the environment)."""

from __future__ import annotations

import logging

import uvicorn

from gateway.app import create_app
from gateway.http.exposure import OpenEndpointRefused, check_exposure
from shared.settings import Settings


def main() -> None:
    """Serve the gateway on LLMFLEET_HOST:LLMFLEET_PORT with uvicorn."""
    settings = Settings.from_env()
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        warning = check_exposure(settings)
    except OpenEndpointRefused as exc:
        raise SystemExit(f"llmfleet: {exc}") from None
    if warning:
        logging.getLogger("gateway").warning(warning)
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level=settings.log_level.lower(),
                timeout_graceful_shutdown=max(1, round(settings.drain_timeout_s)))  # as `llmfleet gateway`


if __name__ == "__main__":
    main()
