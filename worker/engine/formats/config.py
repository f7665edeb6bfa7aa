"""Model hyper-parameters read from GGUF metadata."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

from worker.engine.errors import ModelLoadError
from worker.engine.formats.rope_scaling import RopeScaling, rope_scaling_from_metadata

HYBRID_ATTENTION_EVERY = {"qwen35": 4, "qwen35moe": 4}  # llama.cpp's full_attention_interval where a hybrid's file names none
KV_ELEMENT_BYTES = 2  # the KV pool keeps keys and values as float16 by default (kv/pool.py KV_DTYPE), as llama.cpp does


@dataclass(frozen=True)
class ModelConfig:
    """The numbers that shape a decoder-only transformer."""

    architecture: str
    vocab_size: int
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_ff: int
    context_length: int
    rms_eps: float
    rope_base: float
    rope_dim: int
    sliding_window: int = 0  # keys a sliding-window layer sees (itself included); 0: the architecture has none
    sliding_window_pattern: int = 0  # one global layer in every this many (0: the architecture's own default)
    rope_base_swa: float = 0.0  # RoPE base of sliding-window layers; 0: the file names none (the family's default)
    final_logit_softcap: float = 0.0  # logits -> cap * tanh(logits / cap) when > 0
    layer_norm_eps: float = 1e-12  # LayerNorm epsilon of encoder (BERT-family) models
    pooling_type: int = 0  # what an embedding model's file declares: 1 mean, 2 CLS, 3 last token (0 none)
    rope_scaling: RopeScaling = RopeScaling()  # linear or YaRN context scaling of the rotary frequencies
    n_experts: int = 0  # routed experts of each layer's FFN (0: a dense FFN)
    n_experts_used: int = 0  # experts each token is routed to
    d_ff_expert: int = 0  # hidden width of one expert
    d_ff_shared: int = 0  # hidden width of the shared expert every token also runs (Qwen3.5-MoE); 0: none
    expert_weights_scale: float = 0.0  # the routed weights are scaled by this when it is neither 0 nor 1
    recurrent: tuple[bool, ...] = ()  # per layer: a recurrent (gated delta-net) layer, not attention (hybrids)
    conv_kernel: int = 0  # taps of a recurrent layer's short convolution
    delta_key_heads: int = 0  # a gated delta-net's key (and query) heads (GGUF ssm.group_count)
    delta_value_heads: int = 0  # its value heads (ssm.time_step_rank); each reads key head h % delta_key_heads
    delta_head_dim: int = 0  # its key and value head width (ssm.state_size)
    delta_inner: int = 0  # its value heads times their width (ssm.inner_size), checked against them at load
    rope_sections: tuple[int, ...] = ()  # interleaved M-RoPE's sections (text positions: every one the same)

    @property
    def group_size(self) -> int:
        """Query heads per key/value head (grouped-query attention)."""
        return self.n_heads // self.n_kv_heads

    @property
    def attention_layers(self) -> tuple[int, ...]:
        """The layers that attend (and so hold keys and values in the KV pool): all of them but a hybrid's
        recurrent ones."""
        return tuple(i for i in range(self.n_layers) if not (self.recurrent and self.recurrent[i]))

    @property
    def recurrent_layers(self) -> tuple[int, ...]:
        """The layers whose state is a fixed-size matrix per sequence (recurrent_state.py), in order."""
        return tuple(i for i, flag in enumerate(self.recurrent) if flag)

    @property
    def kv_values_per_token(self) -> int:
        """Key and value elements one token takes in the cache across all attention layers."""
        return 2 * len(self.attention_layers) * self.n_kv_heads * self.head_dim

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of key+value cache one token takes across all layers, in the default float16 pool."""
        return self.kv_values_per_token * KV_ELEMENT_BYTES

    @classmethod
    def from_metadata(cls, metadata: dict[str, Any], path: str = "<memory>") -> ModelConfig:
        """Build a config from GGUF metadata, naming the missing key when one is absent."""
        arch = metadata.get("general.architecture")
        if not isinstance(arch, str):
            raise ModelLoadError(path, "metadata has no general.architecture")
        need = partial(_required, metadata, arch, path)
        d_model, n_heads = int(need("embedding_length")), int(need("attention.head_count"))
        n_kv_heads, head_dim = _kv_shape(metadata, arch, d_model, n_heads, path)
        tokens = metadata.get("tokenizer.ggml.tokens")
        vocab = int(metadata.get(f"{arch}.vocab_size", len(tokens) if isinstance(tokens, list) else 0))
        context_length = int(metadata.get(f"{arch}.context_length", 2048))
        n_layers = int(need("block_count")) - _int_key(metadata, f"{arch}.nextn_predict_layers", path)  # MTP heads
        return cls(
            architecture=arch,
            vocab_size=vocab,
            n_layers=n_layers,
            d_model=d_model,
            n_heads=n_heads,
            n_kv_heads=n_kv_heads,
            head_dim=head_dim,
            d_ff=int(need("feed_forward_length") if f"{arch}.expert_count" not in metadata
                     else metadata.get(f"{arch}.feed_forward_length", 0)),  # an MoE file may name none
            context_length=context_length,
            rms_eps=float(metadata.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
            rope_base=float(metadata.get(f"{arch}.rope.freq_base", 10000.0)),
            rope_dim=int(metadata.get(f"{arch}.rope.dimension_count", head_dim)),
            sliding_window=int(metadata.get(f"{arch}.attention.sliding_window", 0) or 0),
            sliding_window_pattern=_int_key(metadata, f"{arch}.attention.sliding_window_pattern", path),
            rope_base_swa=float(metadata.get(f"{arch}.rope.freq_base_swa", 0.0) or 0.0),
            final_logit_softcap=float(metadata.get(f"{arch}.final_logit_softcapping", 0.0) or 0.0),
            layer_norm_eps=float(metadata.get(f"{arch}.attention.layer_norm_epsilon", 1e-12)),
            pooling_type=int(metadata.get(f"{arch}.pooling_type", 0) or 0),
            rope_scaling=rope_scaling_from_metadata(metadata, arch, context_length, path),
            rope_sections=tuple(int(v) for v in metadata.get(f"{arch}.rope.dimension_sections", ()) or ()),
            **_expert_fields(metadata, arch, path),
            **_recurrent_fields(metadata, arch, n_layers, path),
        )


def _required(metadata: dict[str, Any], arch: str, path: str, key: str) -> Any:
    """The value of `{arch}.{key}`, refused by name when absent."""
    full = f"{arch}.{key}"
    if full not in metadata:
        raise ModelLoadError(path, f"metadata key {full} is missing")
    return metadata[full]


def _kv_shape(metadata: dict[str, Any], arch: str, d_model: int, n_heads: int, path: str) -> tuple[int, int]:
    """(KV heads, head width), refused unless the query heads share KV heads evenly and values are as wide as keys."""
    n_kv_heads = int(metadata.get(f"{arch}.attention.head_count_kv", n_heads))
    head_dim = int(metadata.get(f"{arch}.attention.key_length", d_model // n_heads))
    if n_kv_heads <= 0 or n_heads % n_kv_heads:
        raise ModelLoadError(path, f"head_count {n_heads} is not a multiple of head_count_kv {n_kv_heads}")
    value_dim = int(metadata.get(f"{arch}.attention.value_length", head_dim))
    if value_dim != head_dim:
        raise ModelLoadError(path, f"metadata {arch}.attention.value_length = {value_dim} differs from key_length "
                                   f"{head_dim}: the engine's KV pool holds keys and values of one width")
    return n_kv_heads, head_dim


def _expert_fields(metadata: dict[str, Any], arch: str, path: str) -> dict[str, Any]:
    """A mixture of experts' sizes (all 0 for a dense file)."""
    return {"n_experts": _int_key(metadata, f"{arch}.expert_count", path),
            "n_experts_used": _int_key(metadata, f"{arch}.expert_used_count", path),
            "d_ff_expert": _int_key(metadata, f"{arch}.expert_feed_forward_length", path),
            "d_ff_shared": _int_key(metadata, f"{arch}.expert_shared_feed_forward_length", path),
            "expert_weights_scale": float(metadata.get(f"{arch}.expert_weights_scale", 0.0) or 0.0)}


def _recurrent_fields(metadata: dict[str, Any], arch: str, n_layers: int, path: str) -> dict[str, Any]:
    """A hybrid's recurrent layers and their gated delta-net sizes (none for an attention-only file)."""
    return {"recurrent": _recurrent_layers(metadata, arch, n_layers, path),
            "conv_kernel": _int_key(metadata, f"{arch}.ssm.conv_kernel", path),
            "delta_key_heads": _int_key(metadata, f"{arch}.ssm.group_count", path),
            "delta_value_heads": _int_key(metadata, f"{arch}.ssm.time_step_rank", path),
            "delta_head_dim": _int_key(metadata, f"{arch}.ssm.state_size", path),
            "delta_inner": _int_key(metadata, f"{arch}.ssm.inner_size", path)}


def _recurrent_layers(metadata: dict[str, Any], arch: str, n_layers: int, path: str) -> tuple[bool, ...]:
    """Which layers are recurrent: the file's per-layer flags, else every layer but each `full_attention_interval`-th
    (llama.cpp's qwen35 loader); () where the file names neither (no recurrent layers)."""
    flags = metadata.get(f"{arch}.attention.recurrent_layers")
    if isinstance(flags, list):
        if len(flags) < n_layers:
            raise ModelLoadError(path, f"metadata {arch}.attention.recurrent_layers has {len(flags)} entries for "
                                       f"{n_layers} layers")
        return tuple(bool(flag) for flag in flags[:n_layers])
    interval = _int_key(metadata, f"{arch}.full_attention_interval", path) or HYBRID_ATTENTION_EVERY.get(arch, 0)
    if not interval:
        return ()
    return tuple((i + 1) % interval != 0 for i in range(n_layers))


def _int_key(metadata: dict[str, Any], key: str, path: str) -> int:
    """An integer key (0 when absent); a per-layer array where the engine takes one number is refused by name."""
    value = metadata.get(key, 0)
    if isinstance(value, list):
        raise ModelLoadError(path, f"metadata {key} is a per-layer array: the engine reads one number there")
    return int(value or 0)
