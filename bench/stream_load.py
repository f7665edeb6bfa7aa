"""Streaming load through an OpenAI-compatible server: N concurrent streams, tokens counted from the SSE."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

import httpx


@dataclass
class StreamResult:
    """One streamed completion as the client saw it."""

    sent: float
    chunk_times: list[float] = field(default_factory=list)
    tokens: int = 0  # usage.completion_tokens when the server reports it, else chunks with text
    prompt_tokens: int = 0  # usage.prompt_tokens (0 when the server reports no usage)
    error: str | None = None
    ended: float = 0.0  # when the stream's last line came


@dataclass
class LevelResult:
    """One concurrency level: end-to-end and steady (all streams decoding) rates, TTFT."""

    size: int
    tokens: int
    wall_s: float
    e2e_rate: float
    steady_rate: float
    ttft_p50_s: float
    errors: list[str]
    note: str = ""
    itl_p50_s: float = float("nan")  # median gap between a stream's consecutive text chunks


async def stream_one(client: httpx.AsyncClient, base: str, body: dict[str, object]) -> StreamResult:
    """POST one streaming /completions request and time every chunk that carries text."""
    result = StreamResult(sent=time.perf_counter())
    try:
        async with client.stream("POST", base + "/completions", json=body) as response:
            if response.status_code != 200:
                payload = json.loads(await response.aread() or b"{}").get("error") or {}
                result.error = f"HTTP {response.status_code} {payload.get('code') or payload.get('type')}"
                return result
            usage = None
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line[6:].strip() == "[DONE]":
                    break
                chunk = json.loads(line[6:])
                if chunk.get("error"):
                    result.error = f"stream error {chunk['error'].get('code') or chunk['error'].get('type')}"
                    break
                if any(c.get("text") for c in chunk.get("choices") or []):
                    result.chunk_times.append(time.perf_counter())
                usage = chunk.get("usage") or usage
            result.ended = time.perf_counter()
            result.tokens = int(usage["completion_tokens"]) if usage else len(result.chunk_times)
            result.prompt_tokens = int(usage.get("prompt_tokens") or 0) if usage else 0
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        result.error = type(exc).__name__
    return result


async def long_prompt_ttft(base: str, model: str, tokens: int, api_key: str, tag: str) -> tuple[float, int]:
    """Seconds to the first token of one streamed completion whose prompt is about `tokens` tokens of distinct
    numbered sentences (distinct per tag: no prefix cache can serve it), and its prompt tokens as the server
    counted them (0 when it reports no usage)."""
    words = " ".join(f"{tag} sentence {i} says the river is {i * 7 % 13} metres deep." for i in range(tokens // 19))
    body = {"model": model, "prompt": words, "max_tokens": 2, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    async with httpx.AsyncClient(timeout=httpx.Timeout(600, connect=10),
                                 headers={"Authorization": f"Bearer {api_key}"}) as client:
        result = await stream_one(client, base, body)
    if result.error is not None:
        raise RuntimeError(f"long prompt: {result.error}")
    if not result.chunk_times:  # both tokens without text (a synthetic twin's unused tokens): the whole answer
        return result.ended - result.sent, result.prompt_tokens
    return result.chunk_times[0] - result.sent, result.prompt_tokens


def steady_rate(results: list[StreamResult]) -> float:
    """Tok/s while every stream was decoding: from the last first-chunk to the first last-chunk."""
    timed = [r for r in results if len(r.chunk_times) >= 2]
    if len(timed) != len(results):
        return float("nan")
    start, end = max(r.chunk_times[0] for r in timed), min(r.chunk_times[-1] for r in timed)
    chunks = sum(len(r.chunk_times) for r in timed)
    inside = sum(1 for r in timed for t in r.chunk_times if start < t <= end)
    if end <= start or inside == 0:
        return float("nan")
    return inside / (end - start) * sum(r.tokens for r in timed) / chunks  # chunks -> tokens


async def run_level(base: str, model: str, size: int, max_tokens: int, api_key: str, ignore_eos: bool,
                    timeout_s: float, tag: str) -> LevelResult:
    """`size` streams at once, each a distinct short prompt, greedy, exactly max_tokens when ignore_eos."""
    headers = {"Authorization": f"Bearer {api_key}"}
    limits = httpx.Limits(max_connections=size + 4, max_keepalive_connections=size + 4)
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=10), limits=limits, headers=headers) as client:
        bodies = [{"model": model, "prompt": f"({tag}) Item {i} of {size}: name a fruit, a colour and a city.",
                   "max_tokens": max_tokens, "temperature": 0, "stream": True,
                   "stream_options": {"include_usage": True}, **({"ignore_eos": True} if ignore_eos else {})}
                  for i in range(size)]
        start = time.perf_counter()
        results = await asyncio.wait_for(asyncio.gather(*(stream_one(client, base, b) for b in bodies)), timeout_s)
        wall = time.perf_counter() - start
    ok = [r for r in results if r.error is None]
    ttfts = sorted(r.chunk_times[0] - r.sent for r in ok if r.chunk_times)
    tokens = sum(r.tokens for r in ok)
    gaps = sorted(b - a for r in ok for a, b in zip(r.chunk_times, r.chunk_times[1:]))
    return LevelResult(size, tokens, wall, tokens / wall, steady_rate(ok) if len(ok) == size else float("nan"),
                       ttfts[len(ttfts) // 2] if ttfts else float("nan"), [r.error for r in results if r.error],
                       itl_p50_s=gaps[len(gaps) // 2] if gaps else float("nan"))


async def run_levels(base: str, model: str, sizes: list[int], max_tokens: int, api_key: str,
                     ignore_eos: bool) -> list[LevelResult]:
    """A warm-up request, then every concurrency level in turn (prompts tagged "peer": no prefix-cache hits)."""
    await run_level(base, model, 1, 4, api_key, ignore_eos, 120, "warm-up")
    return [await run_level(base, model, s, max_tokens, api_key, ignore_eos, 300, "peer") for s in sizes]


def peer_model(base: str, api_key: str) -> str:
    """The first model a peer lists."""
    response = httpx.get(base + "/models", headers={"Authorization": f"Bearer {api_key}"}, timeout=10)
    response.raise_for_status()
    return str(response.json()["data"][0]["id"])


