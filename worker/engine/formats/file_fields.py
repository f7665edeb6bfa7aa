"""Honour or refuse: every GGUF metadata key and tensor that changes the arithmetic is read by the file's
architecture, or the load fails naming it. A file the engine cannot compute exactly is never served wrong.

Each architecture lists the `{arch}.*` keys it reads (`metadata_keys`, built from the tables below); its loader
takes the tensors it reads by name (`TensorReads` remembers which). After loading, a key outside the table whose
value means more than "this feature is absent", or a tensor the loader never took, is a ModelLoadError naming it.
"""

from __future__ import annotations

from typing import Any

from worker.engine.errors import ModelLoadError

# What every decoder here reads (config.py and rope_scaling.py): shapes, the norm epsilon, RoPE and its scaling.
DECODER_KEYS = frozenset({
    "block_count", "context_length", "embedding_length", "feed_forward_length", "attention.head_count",
    "attention.head_count_kv", "attention.key_length", "attention.value_length", "attention.layer_norm_rms_epsilon",
    "rope.freq_base", "rope.dimension_count", "rope.scaling.type", "rope.scaling.factor", "rope.scale_linear",
    "rope.scaling.attn_factor", "rope.scaling.original_context_length", "vocab_size", "pooling_type",
})
# Keys that change nothing llama.cpp computes (provenance of a fine-tune).
INFORMATIONAL_KEYS = frozenset({"rope.scaling.finetuned"})
# Keys whose value here means "the feature is absent": present with it, they change nothing; otherwise refused.
NEUTRAL_VALUES: dict[str, tuple[Any, ...]] = {
    "expert_count": (0,), "expert_used_count": (0,), "expert_shared_count": (0,), "expert_group_count": (0,),
    "expert_feed_forward_length": (0,), "expert_shared_feed_forward_length": (0,),
    "attention.sliding_window": (0,), "attn_logit_softcapping": (0.0,), "final_logit_softcapping": (0.0,),
    "router_logit_softcapping": (0.0,), "attention.causal": (True,), "use_parallel_residual": (False,),
    "rope.scaling.type": ("none",), "rope.scaling.factor": (0.0, 1.0), "rope.scale_linear": (0.0, 1.0),
    "rope.scaling.attn_factor": (1.0,), "rope.scaling.yarn_log_multiplier": (0.0,),
    "rope.scaling.yarn_beta_fast": (32.0,), "rope.scaling.yarn_beta_slow": (1.0,),
    "ssm.conv_kernel": (0,), "ssm.inner_size": (0,), "ssm.state_size": (0,), "ssm.time_step_rank": (0,),
    "ssm.group_count": (0,), "logit_scale": (1.0,), "embedding_scale": (1.0,), "residual_scale": (1.0,),
    "attention.scale": (0.0,), "attention.clamp_kqv": (0.0,),
}


def refuse_unread_keys(metadata: dict[str, Any], arch: str, reads: frozenset[str], path: str) -> None:
    """ModelLoadError naming the first `{arch}.*` key the architecture does not read and whose value matters."""
    prefix = f"{arch}."
    for key in sorted(metadata):
        if not key.startswith(prefix):
            continue
        suffix = key[len(prefix):]
        if suffix in reads or suffix in INFORMATIONAL_KEYS:
            continue
        value = metadata[key]
        if suffix in NEUTRAL_VALUES and value in NEUTRAL_VALUES[suffix]:
            continue
        raise ModelLoadError(path, f"metadata {key} = {_short(value)} changes the arithmetic and the {arch} loader "
                                   "does not read it: the engine cannot compute this file exactly")


class TensorReads(dict):  # type: ignore[type-arg]
    """The file's tensors by name, remembering which ones the loader took (by `get` or indexing)."""

    def __init__(self, tensors: dict[str, Any]) -> None:
        super().__init__(tensors)
        self.taken: set[str] = set()

    def get(self, name: str, default: Any = None) -> Any:  # type: ignore[override]
        """The tensor, marked as read."""
        self.taken.add(name)
        return super().get(name, default)

    def __getitem__(self, name: str) -> Any:
        self.taken.add(name)
        return super().__getitem__(name)

    def refuse_unread(self, arch: str, path: str) -> None:
        """ModelLoadError naming the first tensor the loader did not take (and how many more there are)."""
        unread = sorted(set(self) - self.taken)
        if unread:
            more = f" (and {len(unread) - 1} more)" if len(unread) > 1 else ""
            raise ModelLoadError(path, f"tensor {unread[0]}{more} is not read by the {arch} loader: the engine "
                                       "cannot compute this file exactly")


def _short(value: Any) -> str:
    """A metadata value as a log line shows it (arrays by length)."""
    return f"[{len(value)} values]" if isinstance(value, list) else repr(value)
