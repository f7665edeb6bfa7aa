"""The `llmfleet` command: pull models, generate from the command line, run the cluster's parts."""

from __future__ import annotations

import os

# Before numpy loads OpenBLAS: its idle threads spin about 2^28 cycles (0.1 s) after each call by default,
# taking the cores from the compiled kernels that run between BLAS calls (at 16 streams the decode attention
# took 30 ms of a step instead of 10); 2^20 cycles still bridges the gaps between one layer's matmuls.
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "20")

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from llmfleet.catalogue import CatalogueError
from shared.settings import Settings, SettingsError
from shared.settings_reference import help_text
from worker.engine.errors import EngineError
from worker.models import ModelResolveError, pull, resolve


def _add_sampling_flags(parser: argparse.ArgumentParser) -> None:
    """Flags that mirror the engine's SamplingParams and GenerationParams."""
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--top-k", type=int, default=0, help="0 = off")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--min-p", type=float, default=0.0)
    parser.add_argument("--repetition-penalty", type=float, default=1.0)
    parser.add_argument("--presence-penalty", type=float, default=0.0)
    parser.add_argument("--frequency-penalty", type=float, default=0.0)
    parser.add_argument("--logit-bias", action="append", default=[], metavar="TOKEN=BIAS",
                        help="add BIAS to TOKEN's logit (repeatable)")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    parser.add_argument("--ignore-eos", action="store_true")


def _parse_logit_bias(items: Sequence[str]) -> dict[int, float]:
    """Turn TOKEN=BIAS strings into a dict, with a clear error for a malformed one."""
    bias: dict[int, float] = {}
    for item in items:
        token, sep, value = item.partition("=")
        try:
            if not sep:
                raise ValueError
            bias[int(token)] = float(value)
        except ValueError:
            raise SystemExit(f"llmfleet: --logit-bias expects TOKEN=BIAS, got {item!r}") from None
    return bias


def cmd_pull(args: argparse.Namespace) -> int:
    """Download and verify a known model into the cache."""
    path = pull(args.model, progress=True)
    print(path)
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    """Convert a sentence-transformers BERT directory (safetensors) to a GGUF in llama.cpp's bert layout."""
    from worker.bert_convert import ConversionError, convert

    try:
        print(convert(args.directory, args.output, outtype=args.outtype))
    except (ConversionError, OSError, KeyError) as exc:
        raise SystemExit(f"llmfleet convert: {type(exc).__name__}: {exc}") from None
    return 0


def cmd_keys(args: argparse.Namespace) -> int:
    """Add, list or revoke API keys in the key file the gateways read (LLMFLEET_KEYS_FILE)."""
    from gateway.http import api_keys

    path = Path(args.file).expanduser() if args.file else api_keys.default_path()
    if args.action in ("add", "revoke") and not args.name:
        print(f"llmfleet: keys {args.action} needs a name", file=sys.stderr)
        return 2
    try:
        if args.action == "add":
            key = api_keys.add(path, args.name, rpm=args.rpm, tpm=args.tpm, weight=args.weight)
            print(f"{key}\n(shown once: only its sha256 is kept in {path})")
        elif args.action == "revoke":
            api_keys.revoke(path, args.name)
            print(f"revoked {args.name}; gateways reading {path} refuse it within a second")
        else:
            for record in api_keys.load(path):
                limits = f"rpm={record.rpm or 'unlimited'} tpm={record.tpm or 'unlimited'} weight={record.weight:g}"
                print(f"{record.name}\t{limits}\tsha256:{record.digest[:12]}...")
    except api_keys.KeyFileError as exc:
        print(f"llmfleet: {exc}", file=sys.stderr)
        return 2
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    """Run one request through the worker's scheduler (no Redis, no HTTP); stream only the completion."""
    from llmfleet.processes import read_chat_template
    from worker.engine.decode.generation import GenerationParams
    from worker.engine.decode.sampling import SamplingParams
    from worker.engine.engine import Engine
    from worker.local_generation import generate

    engine = Engine.load(resolve(args.model), chat_template=read_chat_template(args.chat_template))
    sampling = SamplingParams(
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
        repetition_penalty=args.repetition_penalty, presence_penalty=args.presence_penalty,
        frequency_penalty=args.frequency_penalty, logit_bias=_parse_logit_bias(args.logit_bias), seed=args.seed,
    )
    try:
        sampling.validate(engine.model.config.vocab_size)
        if args.chat:
            prompt_ids = engine.encode_chat([{"role": "user", "content": args.prompt}])
        else:
            prompt_ids = engine.encode_prompt(args.prompt)
        params = GenerationParams(max_tokens=args.max_tokens, sampling=sampling, stop=tuple(args.stop),
                                  ignore_eos=args.ignore_eos)
        for out in generate(engine, prompt_ids, params):
            if out.text:
                sys.stdout.write(out.text)
                sys.stdout.flush()
    except (EngineError, ValueError) as exc:
        print(f"\nllmfleet: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write("\n")
    return 0


def _settings(args: argparse.Namespace) -> Settings:
    """Settings from the environment, overridden by the flags given on the command line."""
    from dataclasses import replace

    settings = Settings.from_env()
    names = ("host", "port", "allow_open", "slots", "threads", "queue_limit", "max_body_bytes", "kv_budget_mib", "prefix_cache",
             "max_batch_tokens", "max_prefill_tokens", "chat_template", "pool_memory_mib", "pool_keep_alive_s")
    overrides = {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}
    if overrides.get("chat_template"):  # serve's workers may start elsewhere: give them an absolute path
        overrides["chat_template"] = str(Path(overrides["chat_template"]).expanduser().resolve())
    return replace(settings, **overrides)


def cmd_worker(args: argparse.Namespace) -> int:
    """Run one worker pinned to a model, against REDIS_URL."""
    from llmfleet.processes import configure_logging, run_worker

    settings = _settings(args)
    configure_logging(settings.log_level)
    return run_worker(args.model, settings, served_as=args.served_as, worker_id=args.worker_id)


def cmd_gateway(args: argparse.Namespace) -> int:
    """Run the HTTP gateway against REDIS_URL."""
    from llmfleet.processes import configure_logging, run_gateway

    settings = _settings(args)
    configure_logging(settings.log_level)
    return run_gateway(settings)


def cmd_batch_runner(args: argparse.Namespace) -> int:
    """Run a batch runner (an rq worker executing /v1/batches) against REDIS_URL."""
    from llmfleet.processes import configure_logging, run_batch_runner

    settings = _settings(args)
    configure_logging(settings.log_level)
    return run_batch_runner(settings)


def cmd_serve(args: argparse.Namespace) -> int:
    """Run Redis (bundled unless REDIS_URL is set), the gateway and N workers on this machine."""
    from llmfleet.processes import configure_logging, serve

    settings = _settings(args)
    configure_logging(settings.log_level)
    models = args.model or ([] if args.catalogue else ["smollm2-135m"])
    return serve(models, settings, workers=args.workers, lazy=args.lazy, catalogue_file=args.catalogue,
                 max_loaded=args.max_loaded)


def cmd_node(args: argparse.Namespace) -> int:
    """Run a node agent: a pool of model-pinned workers loaded on demand, against REDIS_URL."""
    from llmfleet import catalogue
    from llmfleet.processes import configure_logging, run_node

    settings = _settings(args)
    configure_logging(settings.log_level)
    try:
        entries = catalogue.build(args.model or [], args.catalogue)
    except catalogue.CatalogueError as exc:
        print(f"llmfleet: {exc}", file=sys.stderr)
        return 2
    if not entries:
        print("llmfleet: node needs a catalogue: --model (repeatable) and/or --catalogue FILE", file=sys.stderr)
        return 2
    return run_node(settings, entries, max_loaded=args.max_loaded, eager=args.eager)


def _add_pool_flags(parser: argparse.ArgumentParser) -> None:
    """The node agent's catalogue file and capacity."""
    parser.add_argument("--catalogue", default=None, metavar="FILE", help='models this node may load: JSON '
                        '{"models": {"id": "alias, .gguf path or hf:owner/repo/file.gguf"}}')
    parser.add_argument("--max-loaded", type=int, default=None, help=help_text("pool_max_loaded"))
    parser.add_argument("--memory-mib", dest="pool_memory_mib", type=float, default=None,
                        help=help_text("pool_memory_mib"))
    parser.add_argument("--keep-alive", dest="pool_keep_alive_s", type=float, default=None, metavar="S",
                        help=help_text("pool_keep_alive_s"))


def _slots_flag(raw: str) -> int:
    """--slots N or auto (0)."""
    return 0 if raw.strip().lower() == "auto" else int(raw)


def _add_server_flags(parser: argparse.ArgumentParser, *, gateway: bool, worker: bool) -> None:
    """Flags of the long-running commands; each defaults to its environment variable."""
    if gateway:
        parser.add_argument("--host", default=None, help=help_text("host"))
        parser.add_argument("--port", type=int, default=None, help=help_text("port"))
        parser.add_argument("--allow-open", dest="allow_open", action="store_const", const=1, default=None,
                            help=help_text("allow_open", sets="1"))
        parser.add_argument("--queue-limit", type=int, default=None, help=help_text("queue_limit"))
        parser.add_argument("--max-body-bytes", type=int, default=None, help=help_text("max_body_bytes"))
    if worker:
        parser.add_argument("--slots", type=_slots_flag, default=None, help=help_text("slots"))
        parser.add_argument("--threads", type=int, default=None, help=help_text("threads"))
        parser.add_argument("--kv-budget-mib", type=float, default=None, help=help_text("kv_budget_mib"))
        parser.add_argument("--no-prefix-cache", dest="prefix_cache", action="store_const", const=0, default=None,
                            help=help_text("prefix_cache", sets="0"))
        parser.add_argument("--max-batch-tokens", type=int, default=None, help=help_text("max_batch_tokens"))
        parser.add_argument("--max-prefill-tokens", type=int, default=None, help=help_text("max_prefill_tokens"))
        parser.add_argument("--chat-template", default=None, metavar="FILE", help=help_text("chat_template"))


def cmd_healthcheck(args: argparse.Namespace) -> int:
    """Container health check: 0 when this host's gateway or worker is healthy."""
    from redis.exceptions import RedisError

    from llmfleet.processes import healthcheck

    try:
        return healthcheck(args.role, _settings(args))
    except RedisError:
        return 1


def _pull_command(sub: argparse._SubParsersAction) -> None:
    """`llmfleet pull MODEL`."""
    p = sub.add_parser("pull", help="download a known model into the cache")
    p.add_argument("model", help="a known alias, e.g. smollm2-135m, all-minilm-l6-v2, all-minilm-l6-v2:f16")
    p.set_defaults(func=cmd_pull)


def _convert_command(sub: argparse._SubParsersAction) -> None:
    """`llmfleet convert DIRECTORY OUTPUT`."""
    p = sub.add_parser("convert", help="convert a sentence-transformers BERT folder (safetensors) to GGUF")
    p.add_argument("directory", help="the folder with config.json, model.safetensors, tokenizer.json")
    p.add_argument("output", help="the .gguf file to write")
    p.add_argument("--outtype", choices=["f32", "f16", "q8_0"], default="f32")
    p.set_defaults(func=cmd_convert)


def _keys_command(sub: argparse._SubParsersAction) -> None:
    """`llmfleet keys add|list|revoke`."""
    p = sub.add_parser("keys", help="manage API keys (LLMFLEET_KEYS_FILE, default ~/.config/llmfleet/keys.json)")
    p.add_argument("action", choices=["add", "list", "revoke"])
    p.add_argument("name", nargs="?", help="the key's name (add, revoke); logs and metrics show only this")
    p.add_argument("--rpm", type=int, default=0, help="requests per minute (0 = unlimited)")
    p.add_argument("--tpm", type=int, default=0, help="tokens (prompt + completion) per minute (0 = unlimited)")
    p.add_argument("--weight", type=float, default=1.0,
                   help="its share of a priority class's turns against other keys' (fair shares; default 1)")
    p.add_argument("--file", default=None, help="the key file (default: LLMFLEET_KEYS_FILE or ~/.config/llmfleet/keys.json)")
    p.set_defaults(func=cmd_keys)


def _generate_command(sub: argparse._SubParsersAction) -> None:
    """`llmfleet generate`: the engine alone."""
    p = sub.add_parser("generate", help="generate with the engine alone (no Redis, no HTTP)")
    p.add_argument("--model", default="smollm2-135m", help="alias, path to a .gguf, or hf:owner/repo/file.gguf")
    p.add_argument("--prompt", required=True, help="raw text; special tokens like <|im_start|> are parsed")
    p.add_argument("--chat", action="store_true", help="wrap the prompt as a user message via the chat template")
    p.add_argument("--chat-template", default=None, metavar="FILE", help="a jinja2 chat template instead of "
                   "the model's own (base models have none)")
    _add_sampling_flags(p)
    p.set_defaults(func=cmd_generate)


def _serve_command(sub: argparse._SubParsersAction) -> None:
    """`llmfleet serve`: everything on this machine."""
    p = sub.add_parser("serve", help="everything on this machine: Redis, the gateway and N workers per model")
    p.add_argument("--model", action="append", default=None, help="repeat to serve several models "
                   "(default smollm2-135m)")
    p.add_argument("--workers", type=int, default=1, help="workers per model")
    p.add_argument("--lazy", action="store_true", help="load the models on demand (a warm pool) instead of at start")
    _add_pool_flags(p)
    _add_server_flags(p, gateway=True, worker=True)
    p.set_defaults(func=cmd_serve)


def _node_command(sub: argparse._SubParsersAction) -> None:
    """`llmfleet node`: a node agent."""
    p = sub.add_parser("node", help="a node agent: a pool of workers for a catalogue of models, loaded on demand "
                       "(uses REDIS_URL)")
    p.add_argument("--model", action="append", default=None, metavar="[ID=]SOURCE",
                   help="a model it may load: alias, .gguf path or hf: name, optionally under an id (repeatable)")
    p.add_argument("--eager", action="store_true", help="load every catalogued model at start (kept loaded)")
    _add_pool_flags(p)
    _add_server_flags(p, gateway=False, worker=True)
    p.set_defaults(func=cmd_node)


def _gateway_command(sub: argparse._SubParsersAction) -> None:
    """`llmfleet gateway`."""
    p = sub.add_parser("gateway", help="the OpenAI-compatible HTTP gateway alone (uses REDIS_URL)")
    _add_server_flags(p, gateway=True, worker=False)
    p.set_defaults(func=cmd_gateway)


def _worker_command(sub: argparse._SubParsersAction) -> None:
    """`llmfleet worker`."""
    p = sub.add_parser("worker", help="one worker pinned to a model (uses REDIS_URL)")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--served-as", default=None, metavar="ID", help="the model id to serve it under (default: its "
                   "alias or file stem; node agents set their catalogue's id)")
    p.add_argument("--worker-id", default=None, help="the registry id (default: model id and a random suffix)")
    _add_server_flags(p, gateway=False, worker=True)
    p.set_defaults(func=cmd_worker)


def _batch_runner_command(sub: argparse._SubParsersAction) -> None:
    """`llmfleet batch-runner`."""
    p = sub.add_parser("batch-runner", help="execute /v1/batches: an rq worker on the batch queue (uses REDIS_URL)")
    p.set_defaults(func=cmd_batch_runner)


def _healthcheck_command(sub: argparse._SubParsersAction) -> None:
    """`llmfleet healthcheck ROLE`."""
    p = sub.add_parser("healthcheck", help="exit 0 if this host's gateway or worker is healthy (for containers)")
    p.add_argument("role", choices=["gateway", "worker", "batch-runner"])
    p.add_argument("--port", type=int, default=None, help="the gateway's port (LLMFLEET_PORT)")
    p.set_defaults(func=cmd_healthcheck)


SUBCOMMANDS = (_pull_command, _convert_command, _keys_command, _generate_command, _serve_command, _node_command,
               _gateway_command, _worker_command, _batch_runner_command, _healthcheck_command)  # in `--help`'s order


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand (one function each, above)."""
    parser = argparse.ArgumentParser(prog="llmfleet", description="A self-hosted LLM-serving cluster.")
    sub = parser.add_subparsers(dest="command", required=True)
    for add_command in SUBCOMMANDS:
        add_command(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `llmfleet` console script."""
    args = build_parser().parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except (ModelResolveError, EngineError, SettingsError, CatalogueError) as exc:
        print(f"llmfleet: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
