"""The namespace test bed itself (tests/support/netns.py), with a real redis-server and redis-cli: hosts reach
each other over the bridge, a partition cuts a host off and heal() brings it back, cut() drops only the traffic
between two hosts, the delay proxy inside a host adds its round trip (set_delay changes it), and close() leaves
nothing behind."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.netns import NetnsBed, redis_cli_binary, unavailable

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def _ping(bed: NetnsBed, host: str, url: str, timeout_s: float = 2.0) -> bool:
    reply = bed.run_in(host, ["timeout", str(timeout_s), redis_cli_binary(), "-u", url, "ping"])
    return reply.stdout.strip() == "PONG"


def test_partition_cut_delay_and_cleanup(tmp_path: Path) -> None:
    reason = unavailable() or (None if Path(redis_cli_binary()).is_file() or shutil.which(redis_cli_binary())
                                else "no redis-cli")
    if reason is not None:
        pytest.skip(f"no namespace test bed: {reason}")
    bed = NetnsBed()
    try:
        for name in ("redis", "a", "b"):
            bed.add_host(name)
        url = bed.start_redis("redis", tmp_path / "redis.log")
        assert _ping(bed, "a", url) and _ping(bed, "b", url)
        bed.partition("a")
        assert not _ping(bed, "a", url) and _ping(bed, "b", url)
        bed.heal("a")
        assert _ping(bed, "a", url)
        bed.cut("a", "redis")
        assert not _ping(bed, "a", url) and _ping(bed, "b", url)
        bed.join("a", "redis")
        assert _ping(bed, "a", url)
        delayed = bed.delayed_url("b", url, 0.2, tmp_path / "proxy.log")
        started = time.monotonic()
        assert _ping(bed, "b", url)
        direct_s, started = time.monotonic() - started, time.monotonic()
        assert _ping(bed, "b", delayed)
        assert time.monotonic() - started - direct_s >= 0.18  # at least the PING's round trip through the proxy
        bed.set_delay("b", 2.0)
        time.sleep(0.3)
        assert not _ping(bed, "b", delayed, timeout_s=1.0)  # the proxy's new round trip is in force
    finally:
        bed.close()
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"lf{bed.tag}-" not in namespaces
    assert bed.bridge not in subprocess.run(["ip", "link"], capture_output=True, text=True).stdout
