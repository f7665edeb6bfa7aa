"""A loaded model and its batched forward pass: one step over the new tokens of many sequences."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from worker.engine import ops
from worker.engine.architectures import architecture_for
from worker.engine.architectures.base import Architecture, Encoder
from worker.engine.errors import ContextLengthError, EngineError, ModelLoadError, StepInterrupted
from worker.engine.formats.config import ModelConfig
from worker.engine.formats.file_fields import TensorReads, refuse_unread_keys
from worker.engine.formats.gguf_file import read_gguf
from worker.engine.formats.load_budget import refuse_unless_it_fits
from worker.engine.formats.repack_cache import cache_dir, cached_blocks
from worker.engine.forward_batch import BatchEntry, ForwardBatch, SuspendedForward
from worker.engine.kernels import (
    delta_net,
    draw_kernels,
    float_matmul,
    interleaved_k_matmul,
    interleaved_matmul,
    mxfp4_matmul,
)
from worker.engine.kernels.numba_runtime import set_spin
from worker.engine.kernels.simd_int import PATHS, int_path
from worker.engine.kv.pool import DEFAULT_BLOCK_SIZE, DEFAULT_STATE_SLOTS, KVPool
from worker.engine.lora import LoraAdapter, base_fold_tensors, load_adapter
from worker.engine.ops import Array
from worker.engine.weights.k_blocks import has_k_form
from worker.engine.weights.mxfp4_blocks import MXFP4
from worker.engine.weights.quant_blocks import code_group
from worker.engine.weights.quantized import PendingLinear, held_matrices, materialize

log = logging.getLogger(__name__)


class Model:
    """Config, architecture and weights of one GGUF file; stateless across sequences (KV lives in a KVPool)."""

    def __init__(self, config: ModelConfig, architecture: Architecture | Encoder, weights: Any,
                 metadata: dict | None = None, lora_base: dict[str, np.ndarray] | None = None) -> None:
        self.config = config
        self.architecture = architecture
        self.weights = weights
        self.metadata = metadata or {}
        self.lora_base = lora_base or {}  # the small base tensors (norm weights) adapter loads fold in again

    @classmethod
    def from_file(cls, path: str | Path, *, block_codes: bool = True,
                  repack_dir: Path | None | str = "default") -> Model:
        """Load a GGUF file: its quantized projections, embedding and output in a quantized form only
        (quantized.py; no float32 copy), mapped from the repack cache in `repack_dir` (repack_cache.py; default
        LLMFLEET_REPACK_DIR or ~/.cache/llmfleet/repack; None: built in memory), float tensors as arrays.
        block_codes=False dequantizes every tensor to float32 instead (the tests' float32 reference)."""
        if block_codes:
            refuse_unless_it_fits(path)  # from the header: before any tensor is decoded
        contents = read_gguf(path, keep_quantized=block_codes)
        if contents.metadata.get("general.type") == "adapter":
            raise ModelLoadError(path, "the file is a LoRA adapter, not a model: load it with POST /admin/loras")
        config = ModelConfig.from_metadata(contents.metadata, str(path))
        architecture = architecture_for(config, str(path))
        refuse_unread_keys(contents.metadata, config.architecture, architecture.metadata_keys, str(path))
        set_spin(with_blas=bool(getattr(architecture, "encoder", False)))  # before the first parallel launch
        tensors = TensorReads(contents.tensors)
        for name, raw in contents.quantized.items():
            group = code_group(raw.kind, raw.shape[1])
            tensors[name] = PendingLinear(name, raw.shape, group, raw.decode, kind=raw.kind)  # type: ignore[arg-type]
        directory = cache_dir() if repack_dir == "default" else None if repack_dir is None else Path(repack_dir)
        loaded = architecture.load(tensors, config, str(path))
        tensors.refuse_unread(config.architecture, str(path))  # before any repack work
        weights = materialize(loaded, lambda pendings: cached_blocks(path, pendings, directory))
        if directory is not None:  # the weights are views of the repack file now: the GGUF pages read are not needed
            contents.drop_resident_pages()
        # compiled now, not in the first steps of each width (the float32 kernel serves float weights and LoRA)
        float_matmul.warm(set())
        if any(not has_k_form(raw.kind, raw.shape[1]) and raw.kind != MXFP4 for raw in contents.quantized.values()):
            interleaved_matmul.warm()
        if any(raw.kind == MXFP4 for raw in contents.quantized.values()):
            mxfp4_matmul.warm()
        if any(has_k_form(raw.kind, raw.shape[1]) for raw in contents.quantized.values()):
            interleaved_k_matmul.warm(held_matrices(weights))  # the kinds and scale types held: ~12 s each cold
        if config.recurrent_layers:
            delta_net.warm()
        draw_kernels.warm()  # sampling's: a worker's first sampled request compiles nothing
        log.info("integer kernels: %s path (LLMFLEET_INT_KERNELS=%s forces one)", int_path(), "|".join(PATHS))
        keep = base_fold_tensors(architecture.lora_targets(config), config.n_layers)
        lora_base = {name: np.array(contents.tensors[name]) for name in keep if name in contents.tensors}
        return cls(config, architecture, weights, contents.metadata, lora_base)

    @property
    def is_encoder(self) -> bool:
        """Whether this is an embedding-only encoder (BERT): `encode`, no KV pool, no logits."""
        return bool(getattr(self.architecture, "encoder", False))

    def encode(self, inputs: list[list[int]]) -> tuple[Array, np.ndarray]:
        """An encoder's final hidden states of many whole texts in one forward: (N, D) rows end to end, and the
        (B+1,) row offsets of the texts; each text attends over its own tokens only."""
        if not self.is_encoder:
            raise EngineError(f"{self.config.architecture} is not an encoder; use forward")
        for ids in inputs:
            if not 0 < len(ids) <= self.config.context_length:
                raise ContextLengthError(f"{len(ids)} tokens: an encoder input takes 1 to "
                                         f"{self.config.context_length}")
        lengths = np.array([len(ids) for ids in inputs], np.int64)  # (B,)
        starts = np.concatenate([[0], np.cumsum(lengths)])  # (B+1,)
        tokens = ops.asarray(np.concatenate([np.asarray(ids, np.int64) for ids in inputs]))  # (N,)
        positions = ops.asarray(np.arange(int(starts[-1])) - np.repeat(starts[:-1], lengths))  # (N,)
        hidden = self.architecture.encode(self.weights, tokens, positions, ops.asarray(starts))  # (N, D)
        return hidden, starts

    def load_adapter(self, path: str | Path, name: str) -> LoraAdapter:
        """Load a LoRA adapter for this model (AdapterLoadError naming the tensor when it does not fit)."""
        return load_adapter(path, name, self.config, self.architecture.lora_targets(self.config), self.lora_base)

    def new_pool(self, budget_bytes: int, block_size: int = DEFAULT_BLOCK_SIZE,
                 *, enable_prefix_caching: bool = True, dtype: str = "float16",
                 state_slots: int = DEFAULT_STATE_SLOTS) -> KVPool:
        """A KV pool for this model sized from a memory budget (keys and values as `dtype`: float16 or float32), with
        recurrent state for `state_slots` sequences where the model is a hybrid."""
        return KVPool.from_budget(self.config, budget_bytes, block_size, enable_prefix_caching=enable_prefix_caching,
                                  dtype=dtype, state_slots=state_slots or DEFAULT_STATE_SLOTS)

    def forward(self, entries: list[BatchEntry], pool: KVPool,
                interrupt: Callable[[], bool] | None = None) -> list[Array | None]:
        """One step over a batch whose block tables already cover the new tokens.

        Returns per entry: last logits (V,), all logits (T, V), final hidden states (T, D) or None. `interrupt`
        is asked before each layer after the first and before the output projection; when it answers True the
        step stops with StepInterrupted, whose `suspended` `resume` goes on from (a caller that drops it instead
        redoes the step, which rewrites the keys and values written past each sequence's computed tokens).
        """
        if self.is_encoder:
            raise EngineError(f"{self.config.architecture} is an encoder: it has no causal forward (use encode)")
        for entry in entries:
            end = entry.start + len(entry.tokens)
            if end > self.config.context_length:
                raise ContextLengthError(f"{end} tokens exceed the context length {self.config.context_length}")
            if pool.blocks.num_tokens(entry.seq_id) < end:
                raise ValueError(f"sequence {entry.seq_id} has no KV slots for positions up to {end}")
        if any(entry.loras for entry in entries):  # rows of one adapter set next to each other: slices, not gathers
            order = sorted(range(len(entries)), key=lambda i: _lora_order(entries[i]))
            if order != list(range(len(entries))):
                outputs = self.forward([entries[i] for i in order], pool, interrupt)
                restored: list[Array | None] = [None] * len(entries)
                for position, i in enumerate(order):
                    restored[i] = outputs[position]
                return restored
        batch = ForwardBatch(entries, pool)
        x = self.architecture.embed(self.weights, batch.tokens)  # (N, D)
        return self._layers(batch, x, 0, interrupt)

    def resume(self, suspended: SuspendedForward, pool: KVPool,
               interrupt: Callable[[], bool] | None = None) -> list[Array | None]:
        """Finish a forward that StepInterrupted stopped (its `suspended`, perhaps narrowed by `keep`), as `forward`
        would have: the same outputs, bit for bit, for its entries, whose block tables must be as they were."""
        if not suspended.entries:
            return []
        batch = ForwardBatch(suspended.entries, pool)
        return self._layers(batch, suspended.hidden, suspended.layer, interrupt)

    def _layers(self, batch: ForwardBatch, x: Array, first: int,
                interrupt: Callable[[], bool] | None) -> list[Array | None]:
        """Layers first.. over the rows x (N, D), then the outputs; `interrupt` is asked before each layer after
        the first run here and before the output projection (StepInterrupted then carries x entering it)."""
        entries, pool, n_layers = batch.entries, batch.pool, self.config.n_layers
        if pool.states is not None:  # recurrent layers rewrite their state in place: a hybrid step runs to its end
            interrupt = None
        for layer in range(first, n_layers + 1):
            if layer > first and interrupt is not None and interrupt():
                where = f"layer {layer}" if layer < n_layers else "the output projection"
                raise StepInterrupted(f"stopped before {where}", SuspendedForward(entries, layer, x.copy()))
            if layer < n_layers:
                x = self.architecture.block(self.weights, layer, x, batch)  # (N, D)
        if pool.states is not None:
            pool.states.commit(entries)
        return self._outputs(entries, x, batch.starts)

    def _outputs(self, entries: list[BatchEntry], x: Array, starts: np.ndarray) -> list[Array | None]:
        """Final norm and output projection, only for the rows each entry asked for."""
        spans: list[tuple[int, int]] = []
        for i, entry in enumerate(entries):
            end = int(starts[i + 1])
            first = end - 1 if entry.output == "last" else int(starts[i])
            spans.append((first, end) if entry.output != "none" else (end, end))
        index = ops.asarray(np.concatenate([np.arange(a, b) for a, b in spans]).astype(np.int64))  # (M,)
        hidden = self.architecture.final_hidden(self.weights, x[index])  # (M, D)
        wants_logits = np.concatenate(
            [np.full(b - a, e.output in ("last", "all")) for (a, b), e in zip(spans, entries)])  # (M,)
        logits = (self.architecture.logits(self.weights, hidden[ops.asarray(wants_logits)])
                  if wants_logits.any() else None)  # (M', V)
        results: list[Array | None] = []
        offset = logit_offset = 0
        for (a, b), entry in zip(spans, entries):
            n = b - a
            if entry.output == "hidden":
                results.append(hidden[offset : offset + n])  # (T, D)
            elif entry.output == "last":
                results.append(logits[logit_offset])  # (V,)
            elif entry.output == "all":
                results.append(logits[logit_offset : logit_offset + n])  # (T, V)
            else:
                results.append(None)
            offset += n
            logit_offset += n if entry.output in ("last", "all") else 0
        return results


def _lora_order(entry: BatchEntry) -> tuple[int, ...]:
    """A sort key that puts entries with the same adapters next to each other (base-model entries first)."""
    return tuple(sorted(id(adapter) for adapter, _ in entry.loras))
