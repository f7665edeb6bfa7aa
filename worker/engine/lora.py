"""LoRA adapters from GGUF (llama.cpp's convert_lora_to_gguf.py layout), applied unmerged per batch row.

An adapter file holds `<base tensor>.lora_a` (r, in) and `.lora_b` (out, r) pairs. At load they get the same
transforms as the base weights they target (Q/K rows un-permuted, the query scale and folded norm weights),
and the pairs of one fused base projection (q/k/v, gate/up) are fused into one (A, B): A stacks the parts'
rows, B is block-diagonal, `alpha / r` is folded into B. A step applies `y += scale * B (A x)` to the rows of
each adapter in turn (rows grouped by adapter, never a per-token gather of weights).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from worker.engine import ops
from worker.engine.architectures.common import unpermute_rope_rows
from worker.engine.errors import ModelLoadError
from worker.engine.formats.config import ModelConfig
from worker.engine.formats.gguf_file import read_gguf
from worker.engine.lora_targets import LoraPart, LoraTarget
from worker.engine.ops import Array

MAX_SCALE = 4.0  # |scale| above this is refused: real adapters are used at 0..2
_TENSOR_NAME = re.compile(r"^blk\.(\d+)\.([a-z_0-9]+)\.weight\.lora_([ab])$")


class AdapterLoadError(ModelLoadError):
    """An adapter file could not be loaded or does not fit its base model; the message names the tensor."""

    def __init__(self, path: str | Path, problem: str) -> None:
        super().__init__(path, problem)
        self.args = (f"cannot load LoRA adapter {self.path}: {problem}",)

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True)
class LoraPair:
    """A fused low-rank update of one projection: delta = (x @ a.T) @ b.T."""

    a: Array  # (R, in) the parts' A rows stacked, norm weight folded in
    b: Array  # (out, R) block-diagonal, alpha / r and the row transforms folded in


@dataclass
class LoraAdapter:
    """A loaded adapter: per layer, projection name -> fused pair."""

    name: str
    path: str
    sha256: str
    alpha: float
    rank: int
    targets: tuple[str, ...]  # base tensor names it touches, e.g. ("attn_q", "attn_v")
    layers: tuple[dict[str, LoraPair], ...]
    nbytes: int = field(default=0)

    @property
    def cache_key(self) -> str:
        """What the prefix cache keys this adapter by: its content, not its name (a reload may change it)."""
        return self.sha256


LoraUse = tuple[LoraAdapter, float]  # an adapter and the scale a request applies it with


def lora_set_key(uses: Sequence[LoraUse]) -> int | None:
    """A hash seeding the prefix cache's block chain for one adapter set; None for the base model alone."""
    if not uses:
        return None
    return hash(("lora", tuple(sorted((adapter.cache_key, float(scale)) for adapter, scale in uses))))


def check_scale(scale: float) -> float:
    """A request's adapter scale, or ValueError outside [-MAX_SCALE, MAX_SCALE] (or not finite)."""
    value = float(scale)
    if not np.isfinite(value) or abs(value) > MAX_SCALE:
        raise ValueError(f"LoRA scale {scale} is outside [-{MAX_SCALE}, {MAX_SCALE}]")
    return value


def base_fold_tensors(targets: Sequence[LoraTarget], n_layers: int) -> list[str]:
    """Names of the base tensors an adapter load needs again (the norm weights folded into projections)."""
    norms = sorted({t.input_norm for t in targets if t.input_norm})
    return [f"blk.{i}.{norm}.weight" for i in range(n_layers) for norm in norms]


def load_adapter(path: str | Path, name: str, config: ModelConfig, targets: Sequence[LoraTarget],
                 base_tensors: dict[str, np.ndarray]) -> LoraAdapter:
    """Read and check an adapter file against its base model, and transform it as the base weights were."""
    path = str(path)
    try:
        contents = read_gguf(path)
    except AdapterLoadError:
        raise
    except ModelLoadError as exc:
        raise AdapterLoadError(path, exc.problem) from None
    except OSError as exc:
        raise AdapterLoadError(path, f"cannot read the file ({exc.strerror or exc})") from None
    meta = contents.metadata
    if meta.get("general.type") != "adapter" or meta.get("adapter.type") != "lora":
        raise AdapterLoadError(path, f"not a LoRA adapter (general.type={meta.get('general.type')!r}, "
                                     f"adapter.type={meta.get('adapter.type')!r})")
    arch = meta.get("general.architecture")
    if arch != config.architecture:
        raise AdapterLoadError(path, f"adapter architecture {arch!r} does not match the base model's "
                                     f"{config.architecture!r}")
    alpha = float(meta.get("adapter.lora.alpha", 0.0))
    pairs = _collect_pairs(path, contents.tensors, config, targets)
    if not pairs:
        raise AdapterLoadError(path, "the file holds no lora_a/lora_b tensors")
    layers: list[dict[str, LoraPair]] = [{} for _ in range(config.n_layers)]
    for layer in range(config.n_layers):
        for target in targets:
            fused = _fuse_target(path, layer, target, pairs, alpha, base_tensors)
            if fused is not None:
                layers[layer][target.projection] = fused
    ranks = {a.shape[0] for a, _ in pairs.values()}
    nbytes = sum(p.a.nbytes + p.b.nbytes for layer in layers for p in layer.values())
    return LoraAdapter(
        name=name, path=path, sha256=_sha256(path), alpha=alpha, rank=max(ranks),
        targets=tuple(sorted({key[1] for key in pairs})), layers=tuple(layers), nbytes=nbytes)


def _collect_pairs(path: str, tensors: dict[str, np.ndarray], config: ModelConfig,
                   targets: Sequence[LoraTarget]) -> dict[tuple[int, str], tuple[np.ndarray, np.ndarray]]:
    """(layer, base tensor) -> (A (r, in), B (out, r)), every name, pairing and shape checked."""
    parts = {part.tensor: part for target in targets for part in target.parts}
    halves: dict[tuple[int, str], dict[str, np.ndarray]] = {}
    for tensor_name, array in tensors.items():
        match = _TENSOR_NAME.match(tensor_name)
        if match is None:
            raise AdapterLoadError(path, f"tensor {tensor_name} is not a LoRA tensor of a block projection")
        layer, base, half = int(match.group(1)), match.group(2), match.group(3)
        if layer >= config.n_layers:
            raise AdapterLoadError(path, f"tensor {tensor_name} targets layer {layer}, the base model has "
                                         f"{config.n_layers}")
        if base not in parts:
            raise AdapterLoadError(path, f"tensor {tensor_name} targets {base}, which this engine's "
                                         f"{config.architecture} adapters cannot apply to (supported: "
                                         f"{', '.join(sorted(parts))})")
        if not np.isfinite(array).all():
            raise AdapterLoadError(path, f"tensor {tensor_name} holds non-finite values")
        halves.setdefault((layer, base), {})[half] = array
    pairs = {}
    for (layer, base), found in sorted(halves.items()):
        name = f"blk.{layer}.{base}.weight.lora_"
        if set(found) != {"a", "b"}:
            missing = "b" if "a" in found else "a"
            raise AdapterLoadError(path, f"tensor {name}{missing} is missing (its pair {name}"
                                         f"{'a' if missing == 'b' else 'b'} is present)")
        part, a, b = parts[base], found["a"], found["b"]
        rank = a.shape[0] if a.ndim == 2 else -1
        if a.ndim != 2 or a.shape[1] != part.in_dim or rank <= 0:
            raise AdapterLoadError(path, f"tensor {name}a has shape {a.shape}, expected (r, {part.in_dim})")
        if b.shape != (part.out_dim, rank):
            raise AdapterLoadError(path, f"tensor {name}b has shape {b.shape}, expected ({part.out_dim}, {rank})")
        pairs[(layer, base)] = (a, b)
    return pairs


def _fuse_target(path: str, layer: int, target: LoraTarget, pairs: dict[tuple[int, str], tuple[np.ndarray, np.ndarray]],
                 alpha: float, base_tensors: dict[str, np.ndarray]) -> LoraPair | None:
    """One projection's fused (A, B) in one layer, with the base's transforms; None when nothing targets it."""
    present = [(offset, part, pairs[(layer, part.tensor)]) for offset, part in _offsets(target)
               if (layer, part.tensor) in pairs]
    if not present:
        return None
    out_dim = sum(part.out_dim for part in target.parts)
    total_rank = sum(a.shape[0] for _, _, (a, _) in present)
    a_fused = np.zeros((total_rank, target.parts[0].in_dim), np.float32)  # (R, in)
    b_fused = np.zeros((out_dim, total_rank), np.float32)  # (out, R) block-diagonal
    col = 0
    for offset, part, (a, b) in present:
        rank = a.shape[0]
        scale = alpha / rank if alpha else 1.0  # llama.cpp: alpha 0 means no alpha scaling
        b = b * np.float32(scale * part.out_scale)  # (out_i, r)
        if part.unpermute_heads:
            b = unpermute_rope_rows(b, part.unpermute_heads)  # (out_i, r)
        a_fused[col : col + rank] = a  # (r, in)
        b_fused[offset : offset + part.out_dim, col : col + rank] = b
        col += rank
    if target.input_norm:
        norm_name = f"blk.{layer}.{target.input_norm}.weight"
        norm = base_tensors.get(norm_name)
        if norm is None:
            raise AdapterLoadError(path, f"the base model kept no {norm_name} to fold into the adapter")
        a_fused *= norm[None, :]  # (R, in)
    return LoraPair(a=ops.asarray(np.ascontiguousarray(a_fused)), b=ops.asarray(np.ascontiguousarray(b_fused)))


def _offsets(target: LoraTarget) -> list[tuple[int, LoraPart]]:
    """Each part's first output row inside the fused projection."""
    offsets, row = [], 0
    for part in target.parts:
        offsets.append((row, part))
        row += part.out_dim
    return offsets


def _sha256(path: str) -> str:
    """The file's sha256 (hex)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


class LoraBatch:
    """A step's rows grouped by adapter: for each adapter in the step, its rows and each row's scale."""

    def __init__(self, groups: list[tuple[LoraAdapter, Array | slice, Array]]) -> None:
        self.groups = groups  # (adapter, rows: a slice when contiguous, else a (G,) index array, scales (G, 1))

    @classmethod
    def from_rows(cls, row_uses: Sequence[Sequence[LoraUse]], spans: np.ndarray) -> LoraBatch | None:
        """Group per-entry adapter sets (entry i owns token rows spans[i]:spans[i+1]); None when no row has one.

        An adapter whose rows are contiguous (Model.forward orders entries by adapter set) gets a slice: a view,
        no gather or scatter copy."""
        by_adapter: dict[int, tuple[LoraAdapter, list[np.ndarray], list[np.ndarray]]] = {}
        for i, uses in enumerate(row_uses):
            rows = np.arange(spans[i], spans[i + 1])  # (T_i,)
            for adapter, scale in uses:
                entry = by_adapter.setdefault(id(adapter), (adapter, [], []))
                entry[1].append(rows)
                entry[2].append(np.full(len(rows), scale, np.float32))
        if not by_adapter:
            return None
        groups: list[tuple[LoraAdapter, Array | slice, Array]] = []
        # adapters in one fixed order (by content, then name), not the step's: a row using two adds their deltas
        # in the same order whatever else is in its step (float addition is not associative)
        for adapter, rows_list, scales_list in sorted(by_adapter.values(), key=lambda e: (e[0].cache_key, e[0].name)):
            rows = np.concatenate(rows_list)  # (G,) ascending: entries come in step order
            scales = np.concatenate(scales_list)[:, None]  # (G, 1)
            contiguous = int(rows[-1]) - int(rows[0]) + 1 == len(rows)
            selector: Array | slice = slice(int(rows[0]), int(rows[-1]) + 1) if contiguous else ops.asarray(rows)
            groups.append((adapter, selector, ops.asarray(scales)))
        return cls(groups)

    def add(self, layer: int, projection: str, x: Array, out: Array) -> Array:
        """out (N, out) += each adapter's scaled update of its rows of x (N, in); returns out."""
        for adapter, rows, scales in self.groups:
            pair = adapter.layers[layer].get(projection)
            if pair is None:
                continue
            delta = ops.lora_delta(x[rows], pair.a, pair.b)  # (G, out)
            delta *= scales
            out[rows] += delta
        return out
