"""Embedding benchmark: texts/s of a BERT model (all-MiniLM-L6-v2) in the engine and on /v1/embeddings.

Part 1 (engine): the worker's path (EncoderScheduler) over N sentences of 8-40 words, at several batch token
budgets, against two baselines measured in the same run: one text per forward (no batching) and the bare
matmul chain of the model's own weights over the same tokens (the ceiling). The tokenizer's own rate is
printed too.
Part 2 (--http): a bundled Redis, a gateway and one worker serving the model; `--concurrency` clients send the
same N texts as /v1/embeddings requests of `--inputs-per-request` inputs; texts/s beside part 1's best.
`--peer URL` runs part 2's load against another OpenAI-compatible server (llama-server --embedding) serving
the same GGUF (build one with ../shared/peers/build-llama-server.sh).
Run (from the checkout, PYTHONPATH=.): python bench/embeddings.py [--model all-minilm-l6-v2] [--texts 256] [--http] [--peer URL]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from worker.engine.engine import Engine
from worker.engine.ops import linear
from worker.models import model_id, resolve
from worker.schedule.scheduler_config import SchedulerConfig
from worker.schedule.sequences import EmbeddingRequest

WORD_LIST = ("the a of to and in is was for on that with as by at from this his her which have are were be an or "
         "river city market engine question garden window music science winter history language morning "
         "quickly slowly bright quiet ancient modern simple careful gentle strong measure travel open build "
         "remember discover explain carry follow answer")
WORDS = WORD_LIST.split()


def sentences(count: int, seed: int = 0) -> list[str]:
    """Deterministic English-like sentences of 8 to 40 words."""
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, int(rng.integers(8, 41)))).capitalize() + "." for _ in range(count)]


def scheduler_rate(engine: Engine, inputs: list[list[int]], batch_tokens: int) -> float:
    """Texts/s through the worker's scheduler with a max_batch_tokens budget (one request per 16 texts)."""
    from worker.schedule.encoder_scheduler import new_scheduler

    scheduler = new_scheduler(engine, SchedulerConfig(max_batch_tokens=batch_tokens, max_queue=len(inputs)))
    started = time.perf_counter()
    for i in range(0, len(inputs), 16):
        scheduler.add_embedding(EmbeddingRequest(f"r{i}", inputs[i : i + 16]))
    while scheduler.has_work:
        scheduler.step()
    return len(inputs) / (time.perf_counter() - started)


def one_at_a_time_rate(engine: Engine, inputs: list[list[int]]) -> float:
    """Texts/s with one text per forward (the unbatched baseline)."""
    started = time.perf_counter()
    for ids in inputs:
        engine.embed(ids)
    return len(inputs) / (time.perf_counter() - started)


def matmul_ceiling_rate(engine: Engine, inputs: list[list[int]], batch_tokens: int) -> float:
    """Texts/s of the model's matmuls alone over the same tokens in chunks of batch_tokens rows."""
    weights = engine.model.weights
    total = sum(map(len, inputs))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch_tokens, engine.model.config.d_model)).astype(np.float32)  # (T, D)
    hidden = rng.standard_normal((batch_tokens, engine.model.config.d_ff)).astype(np.float32)  # (T, F)
    started = time.perf_counter()
    for _ in range(-(-total // batch_tokens)):
        for layer in weights.layers:
            linear(x, layer.wqkv)  # (T, 3D)
            linear(x, layer.wo)  # (T, D)
            linear(x, layer.w_up)  # (T, F)
            linear(hidden, layer.w_down)  # (T, D)
    return len(inputs) / (time.perf_counter() - started)


def engine_part(engine: Engine, texts: list[str], budgets: list[int]) -> float:
    """Print part 1's table; return the best scheduler texts/s."""
    started = time.perf_counter()
    inputs = [engine.encode_prompt(t) for t in texts]
    tokenize_rate = len(texts) / (time.perf_counter() - started)
    tokens = sum(map(len, inputs))
    print(f"{len(texts)} texts, {tokens} tokens ({tokens / len(texts):.1f} a text); tokenizer {tokenize_rate:,.0f} texts/s")
    engine.embed_batch(inputs[:8])  # warm
    single = one_at_a_time_rate(engine, inputs)
    print(f"{'batch tokens':>12} {'texts/s':>9} {'tokens/s':>9} {'vs one-at-a-time':>17} {'vs matmul ceiling':>18}")
    print(f"{'(1 text)':>12} {single:9.1f} {single * tokens / len(texts):9.0f} {1.0:16.2f}x {'':>18}")
    best = single
    for budget in budgets:
        rate = scheduler_rate(engine, inputs, budget)
        ceiling = matmul_ceiling_rate(engine, inputs, budget)
        best = max(best, rate)
        print(f"{budget:12d} {rate:9.1f} {rate * tokens / len(texts):9.0f} {rate / single:16.2f}x "
              f"{rate / ceiling:17.2f}x")
    return best


def http_rate(base_url: str, model: str, texts: list[str], per_request: int, concurrency: int) -> float:
    """Texts/s of /v1/embeddings requests of per_request inputs, `concurrency` in flight."""
    def post(chunk: list[str]) -> int:
        body = json.dumps({"model": model, "input": chunk}).encode()
        request = urllib.request.Request(base_url + "/embeddings", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=300) as response:
            return len(json.load(response)["data"])

    chunks = [texts[i : i + per_request] for i in range(0, len(texts), per_request)]
    post(chunks[0])  # warm
    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        done = sum(pool.map(post, chunks))
    assert done == len(texts)
    return done / (time.perf_counter() - started)


def http_part(model: str, texts: list[str], args: argparse.Namespace, engine_best: float) -> None:
    """Start Redis, a gateway and one worker; print /v1/embeddings texts/s (and a peer's)."""
    from bench.cluster_processes import PY, Cluster

    with tempfile.TemporaryDirectory(prefix="bench-embeddings-") as logdir:
        cluster = Cluster(Path(logdir), queue_limit=4 * args.concurrency).start()
        try:
            worker = cluster.spawn("worker", [PY, "-m", "llmfleet.cli", "worker", "--model", args.model])
            cluster.wait_model(model, worker, 300)
            rate = http_rate(cluster.url, model, texts, args.inputs_per_request, args.concurrency)
            print(f"/v1/embeddings: {rate:.1f} texts/s ({args.inputs_per_request} inputs a request, "
                  f"{args.concurrency} in flight) = {rate / engine_best:.2f}x the engine's best")
            if args.peer:
                peer = http_rate(args.peer, args.peer_model or model, texts, args.inputs_per_request, args.concurrency)
                print(f"peer {args.peer}: {peer:.1f} texts/s; ours / peer = {rate / peer:.2f}x")
        finally:
            cluster.close()


def main() -> None:
    """Parse the arguments and run the parts asked for."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="all-minilm-l6-v2")
    parser.add_argument("--texts", type=int, default=256)
    parser.add_argument("--budgets", type=int, nargs="+", default=[256, 1024, 2048, 4096])
    parser.add_argument("--http", action="store_true")
    parser.add_argument("--inputs-per-request", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--peer", help="another server's /v1 base URL (llama-server --embedding)")
    parser.add_argument("--peer-model")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    engine = Engine.load(resolve(args.model))
    texts = sentences(args.texts)
    best = engine_part(engine, texts, args.budgets)
    if args.http or args.peer:
        http_part(model_id(args.model), texts, args, best)


if __name__ == "__main__":
    main()
