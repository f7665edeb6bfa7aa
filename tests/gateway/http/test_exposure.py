"""Safe by default: which gateways may start without an API key, and what the refusal and the warning say."""

from __future__ import annotations

import dataclasses

import pytest

from gateway.http.exposure import OpenEndpointRefused, check_exposure, is_loopback
from shared.settings import Settings


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.0.1.1", True), ("::1", True), ("[::1]", True), ("localhost", True),
    ("0.0.0.0", False), ("::", False), ("192.168.1.10", False), ("gateway.example", False), ("", False),
])
def test_only_loopback_addresses_are_private(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def _settings(**changes: object) -> Settings:
    return dataclasses.replace(Settings(), **changes)


def test_loopback_or_a_key_starts_quietly() -> None:
    assert check_exposure(_settings()) is None  # the default host is 127.0.0.1
    assert check_exposure(_settings(host="0.0.0.0", api_key="k")) is None
    assert check_exposure(_settings(host="0.0.0.0", keys_file="/etc/llmfleet/keys.json")) is None
    assert check_exposure(_settings(host="0.0.0.0", published_host="127.0.0.1")) is None  # compose's default


def test_the_network_with_no_key_is_refused_with_the_reason_and_the_ways_out() -> None:
    with pytest.raises(OpenEndpointRefused) as caught:
        check_exposure(_settings(host="0.0.0.0", port=8080))
    message = str(caught.value)
    assert "0.0.0.0:8080" in message and "no API key" in message
    for way_out in ("LLMFLEET_API_KEY", "LLMFLEET_KEYS_FILE", "127.0.0.1", "LLMFLEET_ALLOW_OPEN=1", "--allow-open"):
        assert way_out in message
    with pytest.raises(OpenEndpointRefused, match="LLMFLEET_PUBLISHED_HOST"):  # published wider than it binds
        check_exposure(_settings(host="127.0.0.1", published_host="0.0.0.0"))


def test_the_opt_in_starts_with_a_warning() -> None:
    warning = check_exposure(_settings(host="0.0.0.0", allow_open=1))
    assert warning is not None and "no API key" in warning and "LLMFLEET_ALLOW_OPEN=1" in warning


def test_the_settings_come_from_the_environment() -> None:
    settings = Settings.from_env({"LLMFLEET_HOST": "0.0.0.0", "LLMFLEET_ALLOW_OPEN": "1",
                                  "LLMFLEET_PUBLISHED_HOST": "10.0.0.5"})
    assert (settings.allow_open, settings.published_host) == (1, "10.0.0.5")
