"""Writing LoRA adapter GGUFs for tests (the layout of llama.cpp's convert_lora_to_gguf.py)."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np


def write_adapter(path: Path, tensors: dict[str, np.ndarray], *, arch: str = "llama", alpha: float = 8.0,
                  general_type: str = "adapter") -> Path:
    """An adapter file holding exactly `tensors` (name -> float32 array in numpy (rows, cols) order)."""
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_string("general.type", general_type)
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", alpha)
    for name, array in tensors.items():
        writer.add_tensor(name, np.ascontiguousarray(array, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def random_pairs(shapes: dict[str, tuple[int, int]], n_layers: int, rank: int, seed: int = 0,
                 scale: float = 0.05) -> dict[str, np.ndarray]:
    """lora_a (rank, in) / lora_b (out, rank) for every layer and target name -> (out, in) of the base tensor."""
    rng = np.random.default_rng(seed)
    tensors = {}
    for layer in range(n_layers):
        for target, (out_dim, in_dim) in shapes.items():
            base = f"blk.{layer}.{target}.weight"
            tensors[base + ".lora_a"] = (rng.standard_normal((rank, in_dim)) * scale).astype(np.float32)
            tensors[base + ".lora_b"] = (rng.standard_normal((out_dim, rank)) * scale).astype(np.float32)
    return tensors
