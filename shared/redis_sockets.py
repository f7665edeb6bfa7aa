"""How long the gateway's and the workers' main Redis clients wait on a socket (one owner for the numbers).

Without bounds, a command on a connection that a network partition cut (packets dropped, no reset) waits until
TCP gives up, minutes later. So every main client is built with:
- `socket_timeout` COMMAND_TIMEOUT_S: a reply not read by then fails the command with redis-py's TimeoutError
  and closes the connection; the caller's "Redis unavailable" handling runs (a 503 with Retry-After in the
  gateway, a logged retry with backoff in a worker) and the next command dials afresh. No legitimate command
  on these pools comes near it: they are short, and the only blocking read on them, the worker's XREADGROUP
  BLOCK (worker/serve/job_feeder.py IDLE_BLOCK_MS), blocks far less (a test holds it under MAX_BLOCK_S).
  Pub/sub reads (gateway/cluster/subscriber.py, worker/serve/cancel_listener.py) read with their own timeouts.
- `socket_connect_timeout` CONNECT_TIMEOUT_S: a dial into a partition fails instead of hanging.
- TCP keepalive (the workers' sync clients): an idle pooled connection whose peer went away is closed by the
  kernel after KEEPALIVE_IDLE_S plus KEEPALIVE_COUNT probes KEEPALIVE_INTERVAL_S apart, so its next command
  redials at once instead of timing out. A paused Redis (SIGSTOP) keeps its connections: its kernel still
  answers the probes. Not the gateway's asyncio pool: a transport the kernel closed with an error looks alive to
  redis-py's pool check there (no EOF), and the next command's write fails with uvloop's RuntimeError instead
  of a ConnectionError; the gateway's subscriber closes the idle pooled connections after an outage instead.
- retries on ConnectionError only (a connection found dead at send: Redis restarted), RETRIES times with a short
  backoff; each client builds its redis-py Retry from these (no redis import in shared/). A timeout is never
  retried: the command may have run (a second XADD would queue a job twice), and a Redis that did not answer
  in COMMAND_TIMEOUT_S is unlikely to answer a retry in time.
"""

from __future__ import annotations

import socket

COMMAND_TIMEOUT_S = 3.0
CONNECT_TIMEOUT_S = 3.0
MAX_BLOCK_S = COMMAND_TIMEOUT_S / 3  # a blocking command on a main pool blocks at most this long
KEEPALIVE_IDLE_S = 5
KEEPALIVE_INTERVAL_S = 2
KEEPALIVE_COUNT = 3
RETRIES = 2
RETRY_BASE_S = 0.05
RETRY_CAP_S = 0.5
SENTINEL_TIMEOUT_S = 1.0  # a sentinel that does not answer a query this soon is skipped for the next


def keepalive_options() -> dict[int, int]:
    """The kernel's keepalive timings, where the platform names them (Linux; others keep their defaults)."""
    names = {"TCP_KEEPIDLE": KEEPALIVE_IDLE_S, "TCP_KEEPINTVL": KEEPALIVE_INTERVAL_S, "TCP_KEEPCNT": KEEPALIVE_COUNT}
    return {getattr(socket, name): value for name, value in names.items() if hasattr(socket, name)}


def socket_options(redis_url: str, *, keepalive: bool = True) -> dict[str, object]:
    """The keyword arguments that bound a main client's sockets (redis-py's sync and asyncio clients alike); TCP
    keepalive only over TCP (a unix socket's peer cannot be partitioned away) and where `keepalive` asks."""
    options: dict[str, object] = {"socket_timeout": COMMAND_TIMEOUT_S, "socket_connect_timeout": CONNECT_TIMEOUT_S}
    if keepalive and not redis_url.startswith("unix:"):
        options.update(socket_keepalive=True, socket_keepalive_options=keepalive_options())
    return options
