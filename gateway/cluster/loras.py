"""LoRA adapters in requests: `model: "<base>:<adapter>"` (as vLLM lists them) and llama.cpp's `lora` field.

Parsing is syntactic (names, scales: a 400 naming the field); `resolve_job` then checks the adapters against
what the model's live workers report in their registry entries (an unknown one is a 404 naming it) and turns
llama.cpp's numeric ids into names (id i = the i-th of the model's adapters sorted by name, as listed by
/v1/models and GET /admin/loras).
"""

from __future__ import annotations

import math
import re
from typing import Any

import msgspec

from gateway.http.fields import invalid, is_int, is_number
from shared.errors import LoraNotFound
from shared.messages import GenerateJob, LoraRef
from shared.registry import RegistryEntry

MAX_LORAS_PER_REQUEST = 8
MAX_SCALE = 4.0  # the engine's bound (worker.engine.lora.MAX_SCALE): |scale| above it is a 400
ADAPTER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_INDEX = "#"  # an unresolved llama.cpp numeric id rides as "#<i>" until resolve_job names it


def split_model(model: str) -> tuple[str, str | None]:
    """`base:adapter` -> (base, adapter); a name whose part after the last ':' is not an adapter name (such as
    hf:owner/repo/file.gguf) is a plain model."""
    base, sep, adapter = model.rpartition(":")
    if not sep or not base or not ADAPTER_NAME.match(adapter) or base == "hf":
        return model, None
    return base, adapter


def parse_loras(body: dict[str, Any], adapter: str | None) -> list[LoraRef]:
    """The adapters a request asks for: the one named in `model` (scale 1) and the `lora` field's."""
    refs = [LoraRef(name=adapter, scale=1.0)] if adapter is not None else []
    value = body.get("lora")
    if value is None:
        return refs
    if not isinstance(value, list):
        raise invalid("lora", 'expected an array of {"id" or "name", "scale"} objects.')
    if len(value) + len(refs) > MAX_LORAS_PER_REQUEST:
        raise invalid("lora", f"at most {MAX_LORAS_PER_REQUEST} adapters per request.")
    for i, item in enumerate(value):
        param = f"lora[{i}]"
        if not isinstance(item, dict):
            raise invalid(param, 'expected an object with "id" or "name", and "scale".')
        scale = item.get("scale", 1.0)
        if not is_number(scale) or not math.isfinite(scale) or abs(scale) > MAX_SCALE:
            raise invalid(f"{param}.scale", f"must be a number between -{MAX_SCALE:g} and {MAX_SCALE:g}.")
        ident = item.get("name", item.get("id"))
        if is_int(ident) and ident >= 0:
            name = f"{_INDEX}{ident}"
        elif isinstance(ident, str) and ADAPTER_NAME.match(ident):
            name = ident
        else:
            raise invalid(param, "needs an adapter name (\"name\" or \"id\") or a non-negative numeric \"id\".")
        refs.append(LoraRef(name=name, scale=float(scale)))
    return refs


def adapters_of(model: str, workers: list[RegistryEntry]) -> list[str]:
    """The adapters some live worker of `model` has loaded, sorted by name."""
    return sorted({name for w in workers if w.model == model for name in w.loras})


def resolve_job(job: GenerateJob, workers: list[RegistryEntry]) -> GenerateJob:
    """The job with numeric ids named; an adapter no live worker of its model has is a 404 naming it."""
    if not job.loras:
        return job
    known = adapters_of(job.model, workers)
    refs = []
    for ref in job.loras:
        name = ref.name
        if name.startswith(_INDEX):
            index = int(name[1:])
            if index >= len(known):
                raise LoraNotFound(f"The LoRA adapter id {index} does not exist for model '{job.model}' "
                                   f"({len(known)} adapters are loaded)", param="lora")
            name = known[index]
        elif name not in known:
            raise LoraNotFound(f"The LoRA adapter '{name}' does not exist for model '{job.model}'", param="model")
        refs.append(LoraRef(name=name, scale=ref.scale))
    return msgspec.structs.replace(job, loras=refs)
