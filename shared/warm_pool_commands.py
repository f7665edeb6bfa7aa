"""The warm pool's Redis commands, each written once for the gateway (asyncio) and the node agent (sync), as
shared/redis_commands.py writes the queue's: a read rule is a generator that `run` / `run_async` executes, a write
rule queues its commands on a pipeline the caller executes. No redis import here.

The wire (CONTRACT.md, "Warm pool"): the live nodes' state hashes and their index, a model's remembered load
failure (`pool_failed`: a node sets it when a load fails, a `load` command forgets it, gateways refuse the
model's requests while it lasts), the models' last use and keep-alive (gateways write, nodes read) and the admin
command stream (gateways write, every node reads).
"""

from __future__ import annotations

from typing import Any

from shared import keys
from shared.redis_commands import Rule, call, reply_text
from shared.warm_pool import NODE_TTL_S, NodeState

COMMANDS_MAXLEN = 1000  # the admin command stream's approximate trim
FORGET_NODES_AFTER_TTLS = 10  # a node id silent for this many node TTLs leaves the nodes index


def _raise_errors(replies: list[Any]) -> list[Any]:
    """The replies, or the first error among them raised (as a pipeline executed with raise_on_error would)."""
    error = next((reply for reply in replies if isinstance(reply, Exception)), None)
    if error is not None:
        raise error
    return replies


def _text(value: object) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def send_command(op: str, model: str, *, force: bool = False) -> Rule[None]:
    """Send an admin command (load / unload) for the node agents (errors raised): a load first forgets the model's
    remembered load failure (else every node would skip it), whichever client sends it. Two rounds, not one MULTI:
    the two keys are in different Redis Cluster slots, and the failure is gone before any node reads the command."""
    if op == "load":
        _raise_errors((yield [call("delete", keys.pool_failed(model))]))
    _raise_errors((yield [call("xadd", keys.POOL_COMMANDS, {"op": op, "model": model, "force": "1" if force else "0"},
                               maxlen=COMMANDS_MAXLEN, approximate=True)]))


def queue_failure(pipe: Any, model: str, message: str, ttl_s: float) -> None:
    """Queue remembering that `model` failed to load (gateways refuse its requests with `message` until it
    expires)."""
    pipe.set(keys.pool_failed(model), message.encode(), ex=max(1, int(ttl_s)))


def remembered_failure(model: str) -> Rule[str | None]:
    """The message of `model`'s remembered load failure, if any."""
    (message,) = _raise_errors((yield [call("get", keys.pool_failed(model))]))
    return None if message is None else _text(message)


def failure_with_ttl(model: str) -> Rule[tuple[str, float] | None]:
    """`model`'s remembered load failure and the seconds it is remembered for (at least 1), if any."""
    message, ttl_ms = _raise_errors((yield [call("get", keys.pool_failed(model)), call("pttl", keys.pool_failed(model))]))
    return None if message is None else (_text(message), max(1.0, (ttl_ms or 1000) / 1000))


def queue_use(pipe: Any, model: str, now: float, keep_alive: float | None = None) -> None:
    """Queue marking `model` used at `now` (the nodes' LRU order), with a request's keep-alive if it named one."""
    pipe.zadd(keys.POOL_USED, {model: now})
    if keep_alive is not None:
        pipe.hset(keys.POOL_KEEP_ALIVE, model, repr(keep_alive))


def _keep_alives(values: dict[Any, Any]) -> dict[str, float]:
    out = {}
    for model, value in values.items():
        try:
            out[_text(model)] = float(value)
        except ValueError:
            continue
    return out


def keep_alives() -> Rule[dict[str, float]]:
    """Each model's keep-alive (seconds, -1 = forever) as its latest request that named one set it."""
    (values,) = _raise_errors((yield [call("hgetall", keys.POOL_KEEP_ALIVE)]))
    return _keep_alives(values)


def usage() -> Rule[tuple[dict[str, float], dict[str, float]]]:
    """Each model's last use by a gateway (unix s) and the keep-alive of its latest request (s; -1 = forever)."""
    used, keep = _raise_errors((yield [call("zrange", keys.POOL_USED, 0, -1, withscores=True),
                                       call("hgetall", keys.POOL_KEEP_ALIVE)]))
    return {_text(model): float(score) for model, score in used}, _keep_alives(keep)


def failures_and_uses(models: list[str]) -> Rule[list[tuple[bytes | None, float | None]]]:
    """Each model's remembered load failure (raw) and last use by a gateway, in the order of `models`."""
    replies = _raise_errors((yield [c for model in models for c in (call("get", keys.pool_failed(model)),
                                                                      call("zscore", keys.POOL_USED, model))]))
    return [(replies[2 * i], replies[2 * i + 1]) for i in range(len(models))]


def live_nodes(now: float) -> Rule[list[NodeState]]:
    """Every node agent whose state is within the node TTL; ids silent for FORGET_NODES_AFTER_TTLS TTLs leave
    the index."""
    (ids,) = _raise_errors((yield [call("zrangebyscore", keys.NODES_INDEX, now - NODE_TTL_S, "+inf")]))
    ids = [reply_text(node_id) for node_id in ids]
    replies = _raise_errors((yield [*(call("hgetall", keys.node_key(node_id)) for node_id in ids),
                                    call("zremrangebyscore", keys.NODES_INDEX, "-inf",
                                         now - FORGET_NODES_AFTER_TTLS * NODE_TTL_S)]))
    nodes = [NodeState.from_hash(node_id, fields or {}) for node_id, fields in zip(ids, replies, strict=False)]
    return [node for node in nodes if node is not None and node.heartbeat >= now - NODE_TTL_S]


def queue_node_state(pipe: Any, state: NodeState) -> None:
    """Queue writing a node's state hash (with its TTL) and its score in the nodes index (in a transaction)."""
    pipe.hset(keys.node_key(state.node_id), mapping=state.to_hash())
    pipe.expire(keys.node_key(state.node_id), int(NODE_TTL_S) + 1)
    pipe.zadd(keys.NODES_INDEX, {state.node_id: state.heartbeat})


def queue_node_removal(pipe: Any, node_id: str) -> None:
    """Queue removing a node's state (clean shutdown)."""
    pipe.delete(keys.node_key(node_id))
    pipe.zrem(keys.NODES_INDEX, node_id)
