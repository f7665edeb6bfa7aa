"""Copies of a GGUF file with metadata keys set or removed and tensors added: the files the honour-or-refuse tests
load (every field of the source kept with its own value type)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np

_PYTHON_TYPES = {bool: gguf.GGUFValueType.BOOL, int: gguf.GGUFValueType.UINT32, float: gguf.GGUFValueType.FLOAT32,
                 str: gguf.GGUFValueType.STRING}


def gpt_oss_copy(source: Path, target: Path) -> Path:
    """`source` (SmolLM2) with gpt-oss's tokenizer keys in place of its own (bench/gpt_oss_tokens.py)."""
    from bench.gpt_oss_tokens import gpt_oss_tokenizer_fields

    reader = gguf.GGUFReader(source)
    fields = {name: field.contents() for name, field in reader.fields.items() if name.startswith("tokenizer.")}
    wanted = gpt_oss_tokenizer_fields(fields)
    return edited_copy(source, target, set_keys=wanted, drop_keys=tuple(name for name in fields if name not in wanted))


def edited_copy(source: Path, target: Path, *, set_keys: dict[str, Any] | None = None,
                drop_keys: tuple[str, ...] = (), add_tensors: dict[str, np.ndarray] | None = None) -> Path:
    """Write `target`: `source` with keys set (a new key gets its Python value's type) or dropped, tensors added."""
    set_keys, add_tensors = dict(set_keys or {}), dict(add_tensors or {})
    reader = gguf.GGUFReader(source)
    arch = str(reader.fields["general.architecture"].contents())
    writer = gguf.GGUFWriter(str(target), arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture" or name in drop_keys:
            continue
        value = set_keys.pop(name, field.contents())
        sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, value, field.types[0], sub_type=sub_type)
    for name, value in set_keys.items():
        if isinstance(value, list):  # a new array key: its items' type
            writer.add_key_value(name, value, gguf.GGUFValueType.ARRAY, sub_type=_PYTHON_TYPES[type(value[0])])
        else:
            writer.add_key_value(name, value, _PYTHON_TYPES[type(value)])
    for tensor in reader.tensors:
        writer.add_tensor(tensor.name, np.asarray(tensor.data), raw_dtype=tensor.tensor_type)
    for name, array in add_tensors.items():
        writer.add_tensor(name, np.ascontiguousarray(array, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return target
