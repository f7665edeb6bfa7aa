"""REDIS_SENTINELS and REDIS_SENTINEL_MASTER: parsed once, bad values fail fast naming the variable, and the
client builders read REDIS_URL only for what Sentinel does not say (password, database, TLS)."""

from __future__ import annotations

import pytest

from shared.redis_target import RedisTarget, parse_sentinels
from shared.settings import Settings, SettingsError


def test_sentinels_parse_to_host_port_pairs() -> None:
    assert parse_sentinels("s1:26379, s2:26380,,[::1]:26381 ") == (("s1", 26379), ("s2", 26380), ("::1", 26381))
    assert parse_sentinels("") == ()


@pytest.mark.parametrize("raw", ["s1", "s1:", ":26379", "s1:0", "s1:65536", "s1:x", "s1:1,s1:1"])
def test_a_malformed_sentinel_list_is_refused_naming_the_variable(raw: str) -> None:
    with pytest.raises(SettingsError, match="^REDIS_SENTINELS: "):
        Settings.from_env({"REDIS_SENTINELS": raw})


def test_settings_give_the_target_every_client_dials() -> None:
    plain = Settings.from_env({"REDIS_URL": "redis://r:6380/1"}).redis_target
    assert plain == RedisTarget("redis://r:6380/1") and not plain.sentinel
    ha = Settings.from_env({"REDIS_URL": "redis://:pw@ignored:1/2", "REDIS_SENTINELS": "a:1,b:2,c:3",
                            "REDIS_SENTINEL_MASTER": "llm"}).redis_target
    assert ha.sentinel and ha.sentinels == (("a", 1), ("b", 2), ("c", 3)) and ha.master == "llm"
    assert "pw" not in ha.describe() and "a:1,b:2,c:3" in ha.describe()


def test_the_default_group_name_is_sentinels_own() -> None:
    assert Settings.from_env({"REDIS_SENTINELS": "a:1"}).redis_target.master == "mymaster"


def test_sentinels_need_a_tcp_url_and_a_group_name() -> None:
    with pytest.raises(SettingsError, match="^REDIS_URL: "):
        Settings.from_env({"REDIS_SENTINELS": "a:1", "REDIS_URL": "unix:///tmp/r.sock"})
    with pytest.raises(SettingsError, match="^REDIS_SENTINEL_MASTER: "):
        Settings(redis_sentinels="a:1", redis_sentinel_master=" ")


def test_the_primary_keeps_the_urls_password_database_and_tls() -> None:
    from batches.redis_clients import primary_options

    options = primary_options(RedisTarget("rediss://u:pw@ignored:1/3", (("a", 1),)))
    assert options == {"username": "u", "password": "pw", "db": 3, "ssl": True}
    assert primary_options(RedisTarget("redis://h:1/0", (("a", 1),))) == {"db": 0}
