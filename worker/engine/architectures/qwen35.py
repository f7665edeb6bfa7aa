"""The `qwen35` architecture (Qwen3.5 dense; llama.cpp's qwen35.cpp and delta-net-base.cpp): three gated delta-net
layers to one gated attention layer (the file's recurrent_layers flags or full_attention_interval), each followed by
a post-attention norm and a dense SwiGLU FFN.

A gated delta-net layer: one projection gives the mixed q/k/v channels, the output gate z, beta and alpha; the mixed
channels pass a causal depthwise convolution (K taps) and SiLU; q and k are L2-normalised; the delta rule runs with
decay exp(softplus(alpha + dt_bias) * A) and rate sigmoid(beta) (delta_net.py); the output is RMS-normed per
head, times SiLU(z), and projected back. Its state lives in the pool's recurrent slots (recurrent_state.py).
A gated attention layer: Qwen3's QK-normed attention whose query projection also yields a per-head gate, the output
multiplied by sigmoid(gate); RoPE rotates a quarter of each head (interleaved M-RoPE, which for text positions is
NEOX RoPE over rope.dimension_count dims). MTP (next-token prediction) layers past the trunk are not run, as
llama-server does not run them by default.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from worker.engine import ops
from worker.engine.architectures.common import Arrays, fold_norm, fuse_rows, take, take_rows
from worker.engine.architectures.llama import Llama, LlamaWeights
from worker.engine.errors import ModelLoadError
from worker.engine.formats.config import ModelConfig
from worker.engine.formats.file_fields import DECODER_KEYS
from worker.engine.forward_batch import ForwardBatch
from worker.engine.kernels import delta_net
from worker.engine.kv.recurrent_state import conv_channels
from worker.engine.lora_targets import LoraPart, LoraTarget
from worker.engine.ops import Array, RotaryTable

HYBRID_KEYS = frozenset({"ssm.conv_kernel", "ssm.inner_size", "ssm.state_size", "ssm.time_step_rank",
                         "ssm.group_count", "full_attention_interval", "attention.recurrent_layers",
                         "rope.dimension_sections", "nextn_predict_layers"})


@dataclass(frozen=True, kw_only=True)
class DenseFFN(Arrays):
    """The dense SwiGLU FFN of a Qwen3.5 layer."""

    w_gate_up: Array  # (2F, D) fused gate/up projection, post_attention_norm folded in
    w_down: Array  # (D, F)


@dataclass(frozen=True, kw_only=True)
class DeltaNetLayer(Arrays):
    """A gated delta-net block."""

    w_mixed_gate: Array  # (C + Hv*Dv, D) the conv channels' and z's projections, attn_norm folded in
    w_beta_alpha: Array  # (2*Hv, D) beta's and alpha's projections, attn_norm folded in
    conv_taps: Array  # (C, K) the depthwise convolution, float32
    dt_bias: Array  # (Hv,)
    decay_rate: Array  # (Hv,) A = -exp(A_log)
    head_norm: Array  # (Dv,) the output's per-head RMS norm weight
    w_out: Array  # (D, Hv*Dv)
    ffn: Any  # DenseFFN, or a routed one (qwen35moe)


@dataclass(frozen=True, kw_only=True)
class GatedAttentionLayer(Arrays):
    """A gated full-attention block."""

    wqkv: Array  # (H*Dh + 2*Hkv*Dh + H*Dh, D) queries, keys, values, then the per-head gates; attn_norm folded in
    wo: Array  # (D, H*Dh)
    q_norm: Array  # (Dh,) QK-norm weight of queries, 1/sqrt(Dh) folded in
    k_norm: Array  # (Dh,)
    ffn: Any  # DenseFFN, or a routed one (qwen35moe)


class Qwen35(Llama):
    """Gated delta-net and gated attention layers, each with a dense FFN after a post-attention norm."""

    name = "qwen35"
    rope_rows_permuted = False
    reads_rope_freqs = False
    qk_norm = True
    metadata_keys = DECODER_KEYS | HYBRID_KEYS

    def load(self, tensors: dict[str, np.ndarray], config: ModelConfig, path: str) -> LlamaWeights:
        """Each layer as its kind; the MTP layers past the trunk are taken (read) and left unused."""
        check_hybrid_shape(config, path)
        layers = tuple(self.load_layer(tensors, config, i, path) for i in range(config.n_layers))
        for name in [n for n in tensors if _layer_of(n) >= config.n_layers]:
            tensors[name]  # noqa: B018 (marked read: a draft head llama-server does not run either)
        d, v = config.d_model, config.vocab_size
        embedding = ops.weight(take(tensors, "token_embd.weight", (v, d), path))  # (V, D)
        output = ops.weight(take(tensors, "output.weight", (v, d), path)) if "output.weight" in tensors else embedding
        return LlamaWeights(config=config, token_embedding=embedding, layers=layers,
                            output_norm=ops.asarray(take(tensors, "output_norm.weight", (d,), path)), output=output,
                            rotary=RotaryTable(config.rope_dim, config.rope_base, config.context_length,
                                               config.rope_scaling))

    def load_layer(self, tensors: dict[str, Any], config: ModelConfig, i: int, path: str) -> Arrays:
        """Block i: a gated delta-net or gated attention, then the FFN."""
        p = f"blk.{i}."
        norm = take(tensors, p + "attn_norm.weight", (config.d_model,), path)  # (D,)
        ffn = self.load_ffn(tensors, config, i, path)
        if config.recurrent[i]:
            return DeltaNetLayer(**self.load_delta_net(tensors, config, p, norm, path), ffn=ffn)
        return GatedAttentionLayer(**self.load_gated_attention(tensors, config, p, norm, path), ffn=ffn)

    def load_ffn(self, tensors: dict[str, Any], config: ModelConfig, i: int, path: str) -> Any:
        """Block i's dense SwiGLU FFN, its post-attention norm folded in."""
        d, f, p = config.d_model, config.d_ff, f"blk.{i}."
        post_norm = take(tensors, p + "post_attention_norm.weight", (d,), path)  # (D,)
        return DenseFFN(
            w_gate_up=ops.weight(fold_norm(fuse_rows(take(tensors, p + "ffn_gate.weight", (f, d), path),
                                                     take(tensors, p + "ffn_up.weight", (f, d), path)), post_norm)),
            w_down=ops.weight(take(tensors, p + "ffn_down.weight", (d, f), path)))  # (2F, D), (D, F)

    def ffn_weights(self, weights: Any, layer: int) -> Any:
        """A block's FFN: its own field here."""
        return weights.layers[layer].ffn

    def load_delta_net(self, tensors: dict[str, Any], config: ModelConfig, p: str, norm: np.ndarray,
                       path: str) -> dict[str, Any]:
        """A gated delta-net's fields."""
        d, hv, dv = config.d_model, config.delta_value_heads, config.delta_head_dim
        c = conv_channels(config)
        mixed = take(tensors, p + "attn_qkv.weight", (c, d), path)  # (C, D)
        gate = take(tensors, p + "attn_gate.weight", (hv * dv, d), path)  # (Hv*Dv, D)
        beta = take(tensors, p + "ssm_beta.weight", (hv, d), path)  # (Hv, D)
        alpha = take(tensors, p + "ssm_alpha.weight", (hv, d), path)  # (Hv, D)
        return dict(
            w_mixed_gate=ops.weight(fold_norm(fuse_rows(mixed, gate), norm)),  # (C + Hv*Dv, D)
            w_beta_alpha=ops.weight(fold_norm(fuse_rows(beta, alpha), norm)),  # (2*Hv, D)
            conv_taps=_float32(take(tensors, p + "ssm_conv1d.weight", (c, config.conv_kernel), path)),  # (C, K)
            dt_bias=_float32(take(tensors, p + "ssm_dt.bias", (hv,), path)),  # (Hv,)
            decay_rate=_float32(take(tensors, p + "ssm_a", (hv,), path)),  # (Hv,)
            head_norm=_float32(take(tensors, p + "ssm_norm.weight", (dv,), path)),  # (Dv,)
            w_out=ops.weight(take(tensors, p + "ssm_out.weight", (d, hv * dv), path)),  # (D, Hv*Dv)
        )

    def load_gated_attention(self, tensors: dict[str, Any], config: ModelConfig, p: str, norm: np.ndarray,
                             path: str) -> dict[str, Any]:
        """A gated attention layer's fields: each head's query rows and gate rows (interleaved in the file) apart."""
        d, h, dh = config.d_model, config.n_heads, config.head_dim
        kv_dim = config.n_kv_heads * dh
        query_gate = take(tensors, p + "attn_q.weight", (2 * h * dh, d), path)  # (H*2Dh, D) per head [q; gate]
        rows = np.arange(2 * h * dh).reshape(h, 2, dh)  # (H, 2, Dh)
        wq = take_rows(query_gate, rows[:, 0].reshape(-1))  # (H*Dh, D)
        wgate = take_rows(query_gate, rows[:, 1].reshape(-1))  # (H*Dh, D)
        wk = take(tensors, p + "attn_k.weight", (kv_dim, d), path)  # (Hkv*Dh, D)
        wv = take(tensors, p + "attn_v.weight", (kv_dim, d), path)  # (Hkv*Dh, D)
        query_scale = np.float32(1.0 / np.sqrt(dh))
        return dict(
            wqkv=ops.weight(fold_norm(fuse_rows(wq, wk, wv, wgate), norm)),  # (2*H*Dh + 2*Hkv*Dh, D)
            wo=ops.weight(take(tensors, p + "attn_output.weight", (d, h * dh), path)),  # (D, H*Dh)
            q_norm=ops.asarray(take(tensors, p + "attn_q_norm.weight", (dh,), path) * query_scale),  # (Dh,)
            k_norm=ops.asarray(take(tensors, p + "attn_k_norm.weight", (dh,), path)),  # (Dh,)
        )

    def lora_targets(self, config: ModelConfig) -> tuple[LoraTarget, ...]:
        """Adapters may target the FFN (every layer has one); the mixed attention kinds take none."""
        d, f = config.d_model, config.d_ff
        return (LoraTarget("gate_up", (LoraPart("ffn_gate", f, d), LoraPart("ffn_up", f, d)), "post_attention_norm"),
                LoraTarget("down", (LoraPart("ffn_down", d, f),)))

    def block(self, weights: LlamaWeights, layer: int, x: Array, batch: ForwardBatch) -> Array:
        """The layer's mixer (delta-net or gated attention), pre-normed and residual, then the FFN: x (N, D)."""
        w = weights.layers[layer]
        normed = ops.rms_normalize(x, weights.config.rms_eps)  # (N, D)
        if isinstance(w, DeltaNetLayer):
            x += self.delta_net(weights.config, w, layer, normed, batch)  # (N, D)
        else:
            x += self.gated_attention(weights, w, layer, normed, batch)  # (N, D)
        return self.feed_forward(weights, layer, x, batch)  # (N, D)

    def delta_net(self, cfg: ModelConfig, w: DeltaNetLayer, layer: int, normed: Array, batch: ForwardBatch) -> Array:
        """A gated delta-net over normed (N, D), advancing each sequence's state slot: (N, D)."""
        n, c = normed.shape[0], conv_channels(cfg)
        hk, hv, dk = cfg.delta_key_heads, cfg.delta_value_heads, cfg.delta_head_dim
        mixed_gate = ops.linear(normed, w.w_mixed_gate)  # (N, C + Hv*Dv)
        decay, beta = delta_net.gates(ops.linear(normed, w.w_beta_alpha), w.dt_bias,
                                              w.decay_rate)  # (N, Hv) x2: log decay (< 0), sigmoid(b)
        states, slots = batch.pool.states, batch.state_slots
        index = states.layer_index[layer]
        conv = delta_net.short_conv(mixed_gate[:, :c], batch.starts, slots, states.conv[index],
                                            w.conv_taps)  # (N, C)
        qk = l2_normalize_heads(conv[:, : 2 * hk * dk].reshape(n, 2 * hk, dk), cfg.rms_eps)  # (N, 2*Hk, Dk)
        v = conv[:, 2 * hk * dk :].reshape(n, hv, dk)  # (N, Hv, Dv)
        out = delta_net.gated_delta(qk[:, :hk], qk[:, hk:], v, decay, beta, batch.starts, slots,
                                            states.matrices[index])  # (N, Hv, Dv)
        out = delta_net.gated_norm(out, mixed_gate[:, c:], w.head_norm, cfg.rms_eps)  # (N, Hv*Dv)
        return ops.linear(out, w.w_out)  # (N, D)

    def gated_attention(self, weights: LlamaWeights, w: GatedAttentionLayer, layer: int, normed: Array,
                        batch: ForwardBatch) -> Array:
        """Qwen3's QK-normed attention over normed (N, D), its output times sigmoid(gate): (N, D)."""
        cfg = weights.config
        h, hkv, dh = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        q_dim, kv_dim = h * dh, hkv * dh
        qkvg = ops.contiguous(ops.linear(normed, w.wqkv))  # (N, 2*H*Dh + 2*Hkv*Dh)
        qk = ops.rms_normalize_heads(qkvg[:, : q_dim + kv_dim].reshape(-1, h + hkv, dh), cfg.rms_eps)  # (N, H+Hkv, Dh)
        qk[:, :h] *= w.q_norm  # (N, H, Dh)
        qk[:, h:] *= w.k_norm  # (N, Hkv, Dh)
        cos, sin = batch.rope_angles(weights.rotary)  # (N, 1, R/2) x2
        weights.rotary.apply(qk, cos, sin)
        v = qkvg[:, q_dim + kv_dim : q_dim + 2 * kv_dim].reshape(-1, hkv, dh)  # (N, Hkv, Dh)
        attn = batch.attention(layer, qk[:, :h], qk[:, h:], v)  # (N, H*Dh)
        gate = qkvg[:, q_dim + 2 * kv_dim :]  # (N, H*Dh)
        attn *= 1.0 / (1.0 + np.exp(-gate))  # (N, H*Dh) times sigmoid(gate)
        return ops.linear(attn, w.wo)  # (N, D)


def l2_normalize_heads(x: Array, eps: float) -> Array:
    """Every head vector of x (N, H, Dh) over its norm: x / sqrt(sum x^2 + eps), as ggml's rms_norm(eps / Dh)
    scaled by 1/sqrt(Dh) (llama.cpp's build_gdn_l2_norm)."""
    width = x.shape[2]
    return ops.rms_normalize_heads(ops.contiguous(x), eps / width) * np.float32(1.0 / np.sqrt(width))  # (N, H, Dh)


def check_hybrid_shape(config: ModelConfig, path: str) -> None:
    """Refuse, by name, a hybrid file whose numbers the engine's kernels do not compute as llama.cpp does."""
    if not config.recurrent or not any(config.recurrent):
        raise ModelLoadError(path, f"{config.architecture}: the file marks no recurrent layer")
    if config.conv_kernel < 2 or not config.delta_head_dim or not config.delta_key_heads:
        raise ModelLoadError(path, f"{config.architecture}: ssm.conv_kernel, ssm.state_size and ssm.group_count are "
                                   "needed for its gated delta-net layers")
    if config.delta_inner != config.delta_value_heads * config.delta_head_dim:
        raise ModelLoadError(path, f"ssm.inner_size {config.delta_inner} is not ssm.time_step_rank x ssm.state_size "
                                   f"({config.delta_value_heads} x {config.delta_head_dim})")
    if config.delta_value_heads % config.delta_key_heads:
        raise ModelLoadError(path, f"ssm.time_step_rank {config.delta_value_heads} is not a multiple of "
                                   f"ssm.group_count {config.delta_key_heads}")
    half = config.rope_dim // 2
    sections = (tuple(config.rope_sections) + (0, 0, 0, 0))[:4]
    if sum(sections) and any(not _text_sector(i % sum(sections), sections) for i in range(half)):
        raise ModelLoadError(path, f"rope.dimension_sections {list(config.rope_sections)} leave rotary dims to the "
                                   "fourth (extra) position: only text positions are computed here")


def _text_sector(sector: int, sections: tuple[int, ...]) -> bool:
    """Whether interleaved M-RoPE gives this sector the text position (ggml's imrope: sectors 3j, 3j+1, 3j+2 go to
    the t, h, w sections while they last; text positions put the same value in all three)."""
    return any(sector % 3 == axis and sector < 3 * sections[axis] for axis in range(3))


def _layer_of(name: str) -> int:
    """The block index of a `blk.{i}.` tensor name, or -1."""
    parts = name.split(".")
    return int(parts[1]) if parts[0] == "blk" and len(parts) > 2 and parts[1].isdigit() else -1


def _float32(array: Any) -> Array:
    """A small tensor as a contiguous float32 array."""
    return ops.asarray(np.ascontiguousarray(np.asarray(array, np.float32)))
