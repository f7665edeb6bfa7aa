"""Settings come from the environment once, with defaults and clear errors."""

from __future__ import annotations

import dataclasses

import pytest

from shared.settings import ENV, Settings, SettingsError


def test_defaults_and_overrides() -> None:
    assert Settings.from_env({}) == Settings()
    settings = Settings.from_env(
        {
            "REDIS_URL": "redis://r:6380/1",
            "LLMFLEET_PORT": "9000",
            "LLMFLEET_API_KEY": "sk-test",
            "LLMFLEET_QUEUE_LIMIT": "3",
            "LLMFLEET_REQUEST_TIMEOUT_S": "2.5",
            "LLMFLEET_LOG_LEVEL": "debug",
            "LLMFLEET_SLOTS": "",
        }
    )
    assert (settings.redis_url, settings.port, settings.api_key) == ("redis://r:6380/1", 9000, "sk-test")
    assert (settings.queue_limit, settings.request_timeout_s, settings.log_level) == (3, 2.5, "DEBUG")
    assert settings.slots == Settings().slots
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.port = 1  # type: ignore[misc]


def test_every_field_has_an_environment_variable() -> None:
    assert set(ENV) == {f.name for f in dataclasses.fields(Settings)}


@pytest.mark.parametrize(
    ("env", "match"),
    [
        ({"LLMFLEET_PORT": "eighty"}, "LLMFLEET_PORT='eighty': expected an integer"),
        ({"LLMFLEET_PORT": "70000"}, "LLMFLEET_PORT: must be in 1..65535"),
        ({"LLMFLEET_QUEUE_LIMIT": "0"}, "LLMFLEET_QUEUE_LIMIT: must be >= 1"),
        ({"LLMFLEET_REQUEST_TIMEOUT_S": "inf"}, "expected a finite number"),
        ({"LLMFLEET_REQUEST_TIMEOUT_S": "-1"}, "LLMFLEET_REQUEST_TIMEOUT_S: must be > 0"),
        ({"LLMFLEET_HEARTBEAT_TTL_S": "0.5"}, "LLMFLEET_HEARTBEAT_TTL_S: must be longer"),
        ({"LLMFLEET_LEASE_S": "0.5"}, "LLMFLEET_LEASE_S: must be longer"),
        ({"REDIS_URL": "http://x"}, "REDIS_URL: must start with"),
        ({"LLMFLEET_API_KEY": "   "}, "LLMFLEET_API_KEY: must not be blank"),
        ({"LLMFLEET_LOG_LEVEL": "LOUD"}, "LLMFLEET_LOG_LEVEL: must be one of"),
        ({"LLMFLEET_KV_DTYPE": "bfloat16"}, "LLMFLEET_KV_DTYPE: must be one of float16, float32"),
    ],
)
def test_bad_values_name_the_variable(env: dict[str, str], match: str) -> None:
    with pytest.raises(SettingsError, match=match):
        Settings.from_env(env)


def test_repr_hides_secrets() -> None:
    text = repr(Settings(api_key="sk-secret", redis_url="redis://:pw@host:6379/0"))
    assert "sk-secret" not in text
    assert "pw@" not in text
