"""The configuration reference, written from Settings' own text: `python -m shared.settings_reference` prints
docs/configuration.md, and the CLI's --help reads `help_text` for the flags that set a setting.

The few variables read outside Settings (by the engine, the model store, docker-compose) are listed in OTHERS with
the file that reads each; tests/docs/test_settings_reference.py checks both lists against the code both ways."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

from shared.settings import ENV, Settings, allowed, doc

REFERENCE_PATH = "docs/configuration.md"
COMMAND = "python -m shared.settings_reference > docs/configuration.md"


class Other(NamedTuple):
    """A variable read outside Settings: its default, what it means, and the file that reads it."""

    variable: str
    default: str
    meaning: str
    read_by: str


OTHERS: tuple[Other, ...] = (
    Other("LLMFLEET_CACHE", "`~/.cache/llmfleet`", "The model cache directory (`llmfleet pull` writes there).",
          "worker/models.py"),
    Other("LLMFLEET_REPACK_DIR", "`~/.cache/llmfleet/repack`", "Where a model's quantized weights in their held "
          "form are cached, one file per model file (named by its size, mtime, first/last MiB and the layout "
          "version; checked by size and checksum before it is mapped, rebuilt when truncated or corrupt), beside "
          "what a first start derived (the start-up decode rate, a SentencePiece vocabulary's merges). Set empty: "
          "build in memory, no cache.", "worker/engine/formats/repack_cache.py"),
    Other("LLMFLEET_TEMPLATE_NOW", "the host's clock", "An ISO 8601 time (`2026-11-29T12:00:00`) chat templates "
          "see instead of the clock (`strftime_now`: gpt-oss's and Llama 3's date), so that the same request gives "
          "the same reply on another day; a malformed value fails the model's load.",
          "worker/engine/text/template_sandbox.py"),
    Other("LLMFLEET_INT_KERNELS", "from the CPU's flags", "`avx512vnni`, `avx2` or `generic`: the instruction path "
          "of the integer kernels that multiply quantized weights (all give the same bits; the worker logs the one "
          "it uses at load; a path the CPU lacks is refused at start).", "worker/engine/kernels/simd_int.py"),
    Other("LLMFLEET_PUBLISH", "`127.0.0.1`", "docker-compose only: the host address the gateway's port is "
          "published on; compose passes it to the gateway as LLMFLEET_PUBLISHED_HOST.", "docker-compose.yml"),
    Other("OPENBLAS_THREAD_TIMEOUT", "`20` (set by `llmfleet` unless given)", "How long OpenBLAS's idle threads spin after a call "
          "(2^20 cycles at 20, against about 2^28 by default, which took the cores from the compiled kernels "
          "between BLAS calls).",
          "llmfleet/cli.py"),
    Other("GOMP_SPINCOUNT", "300,000 for a decoder, 10,000 for an encoder (set at model load unless given)",
          "How long libgomp's idle threads spin: a decoder's still spin when the next launch comes (not asleep "
          "while the gateway and Redis hold the cores); an encoder's BLAS threads need the cores.",
          "worker/engine/kernels/numba_runtime.py"),
)


def shown_default(name: str) -> str:
    """A setting's default as the reference and --help print it."""
    value = Settings.__dataclass_fields__[name].default
    if value is None:
        return "unset"
    if value == "":
        return "empty"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    text = str(value)
    if name.endswith("_bytes") and isinstance(value, int):
        text += f" ({value / 2**20:g} MiB)"
    return text + (" (auto)" if name == "slots" else "")


def help_text(name: str, *, sets: str | None = None) -> str:
    """The --help line of a flag that sets `name`: its meaning, variable and default (% escaped for argparse)."""
    source = f"this flag sets {ENV[name]}={sets}" if sets is not None else f"{ENV[name]}, default {shown_default(name)}"
    return f"{doc(name)} ({source})".replace("%", "%%")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render() -> str:
    """docs/configuration.md: every setting with its variable, default, accepted values and meaning."""
    lines = [
        "# Configuration reference",
        "",
        f"<!-- Generated from shared/settings.py by `{COMMAND}`; do not edit by hand. -->",
        "",
        "Every setting is an environment variable, read once at start (`shared/settings.py`); a value out of its",
        "range stops the process with a message naming the variable. The flags of `serve`, `node`, `gateway` and",
        "`worker` override the most common ones, and their `--help` prints the same text as this page.",
        "",
        "| variable | default | accepts | meaning |",
        "|---|---|---|---|",
    ]
    for item in dataclasses.fields(Settings):
        name = item.name
        lines.append(f"| `{ENV[name]}` | `{shown_default(name)}` | {_cell(allowed(name))} | {_cell(doc(name))} |")
    lines += [
        "",
        "## Read outside Settings",
        "",
        "| variable | default | meaning | read by |",
        "|---|---|---|---|",
    ]
    lines += [f"| `{o.variable}` | {o.default} | {_cell(o.meaning)} | `{o.read_by}` |" for o in OTHERS]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render(), end="")
