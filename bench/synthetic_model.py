"""Synthetic twins: GGUF files with a real model family's configuration and metadata and seeded random weights.

No package ships Llama 3.x or Qwen3 weights, and none of any size users run, so parity with llama.cpp and the
benchmarks use twins: the keys, tensor names and layouts llama.cpp's converter writes for the family (Llama 3's
`rope_freqs.weight` from its rope_scaling, Qwen3's QK-norm weights and key_length), the real shape's numbers, and
weights from a counter-based hash (the same bytes on every machine and numpy version) scaled so that activations
stay in a realistic range (projections 1/sqrt(fan-in), the blocks' writes into the residual stream 1/sqrt(2 layers)
smaller, output rows giving logits of a few units, norm weights near 1). The tokenizer is SmolLM2's (read from its GGUF) under the family's pre-tokenizer name, padded with unused tokens
to the family's vocabulary size; Qwen3 twins add `<think>` / `</think>` and a Qwen3-style chat template with
`enable_thinking`. F16 is written here; every other type is made from it by llama.cpp's own `llama-quantize`.

    python bench/synthetic_model.py --family llama3 --shape 1b --type Q4_K_M --out /tmp/llama3-1b.gguf
    python bench/synthetic_model.py --family qwen3 --shape tiny --type F16 --out /tmp/qwen3-tiny.gguf

Prints the file's path. The same arguments give the same bytes.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGUFWriter, RopeScalingType

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from worker.engine.formats.gguf_file import read_metadata  # noqa: E402

TYPES = ("F16", "Q8_0", "Q4_K_M", "Q4_0", "Q5_K_M", "Q6_K", "MXFP4_MOE")  # F16 here, the others by llama-quantize


@dataclass(frozen=True)
class Shape:
    """A model's numbers as its config.json gives them."""

    layers: int
    width: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int  # 0: SmolLM2's own vocabulary, unpadded
    tied: bool
    context: int
    rope_theta: float
    rms_eps: float
    rope_factor: float = 0.0  # Llama 3's rope_scaling.factor (0: none)
    experts: int = 0  # routed experts of each layer's FFN (0: a dense FFN)
    experts_used: int = 0  # experts each token is routed to
    expert_ffn: int = 0  # hidden width of one expert
    sliding_window: int = 0  # gpt-oss: keys its sliding-window layers (every other one) see
    yarn_original: int = 0  # > 0: YaRN RoPE scaling by rope_factor from this original context
    delta_heads: tuple[int, int, int] = (0, 0, 0)  # Qwen3.5's gated delta-net: (key heads, value heads, head dim)
    shared_ffn: int = 0  # Qwen3.5-MoE's shared expert's hidden width


FAMILIES: dict[str, dict[str, Shape]] = {
    "llama3": {  # Llama-3.2-1B, Llama-3.2-3B, Llama-3.1-8B: rope_scaling llama3, low 1, high 4, original 8192
        "tiny": Shape(2, 256, 4, 2, 64, 512, 0, True, 131072, 500000.0, 1e-5, 32.0),
        "1b": Shape(16, 2048, 32, 8, 64, 8192, 128256, True, 131072, 500000.0, 1e-5, 32.0),
        "3b": Shape(28, 3072, 24, 8, 128, 8192, 128256, True, 131072, 500000.0, 1e-5, 32.0),
        "8b": Shape(32, 4096, 32, 8, 128, 14336, 128256, False, 131072, 500000.0, 1e-5, 8.0),
    },
    "qwen3": {  # Qwen3-0.6B, 1.7B, 4B, 8B: head_dim 128 whatever the width
        "tiny": Shape(2, 256, 4, 2, 128, 512, 0, True, 40960, 1000000.0, 1e-6),
        "0.6b": Shape(28, 1024, 16, 8, 128, 3072, 151936, True, 40960, 1000000.0, 1e-6),
        "1.7b": Shape(28, 2048, 16, 8, 128, 6144, 151936, True, 40960, 1000000.0, 1e-6),
        "4b": Shape(36, 2560, 32, 8, 128, 9728, 151936, True, 40960, 1000000.0, 1e-6),
        "8b": Shape(36, 4096, 32, 8, 128, 12288, 151936, False, 40960, 1000000.0, 1e-6),
    },
    "smollm3": {  # SmolLM3-3B: NoPE every fourth layer, Llama 3's tokenizer
        "tiny": Shape(4, 256, 4, 2, 64, 512, 0, True, 65536, 5000000.0, 1e-6),
        "3b": Shape(36, 2048, 16, 4, 128, 11008, 128256, True, 65536, 5000000.0, 1e-6),
    },
    "qwen3moe": {  # Qwen3-30B-A3B (128 experts, 8 used, expert FFN 768), and it with half its layers
        "tiny": Shape(2, 256, 4, 2, 64, 512, 0, True, 40960, 1000000.0, 1e-6, 0.0, 8, 2, 256),
        "half": Shape(24, 2048, 32, 4, 128, 6144, 151936, False, 40960, 1000000.0, 1e-6, 0.0, 128, 8, 768),
        "30b-a3b": Shape(48, 2048, 32, 4, 128, 6144, 151936, False, 40960, 1000000.0, 1e-6, 0.0, 128, 8, 768),
    },
}
FAMILIES["gpt-oss"] = {  # gpt-oss-20b (24 layers, 32 experts, 4 used, MXFP4 experts), and it with half its layers
    "tiny": Shape(2, 256, 4, 2, 64, 256, 0, False, 131072, 150000.0, 1e-5, 32.0, 8, 2, 256, 16, 4096),
    "half": Shape(12, 2880, 64, 8, 64, 2880, 201088, False, 131072, 150000.0, 1e-5, 32.0, 32, 4, 2880, 128, 4096),
    "20b": Shape(24, 2880, 64, 8, 64, 2880, 201088, False, 131072, 150000.0, 1e-5, 32.0, 32, 4, 2880, 128, 4096),
}
FAMILIES["qwen35"] = {  # Qwen3.5-0.8B, 2B, 4B, 9B: three gated delta-net layers to one gated attention layer
    "tiny": Shape(4, 256, 4, 2, 64, 512, 0, True, 262144, 10000000.0, 1e-6, delta_heads=(2, 4, 32)),
    "0.8b": Shape(24, 1024, 8, 2, 256, 3584, 248320, True, 262144, 10000000.0, 1e-6, delta_heads=(16, 16, 128)),
    "2b": Shape(24, 2048, 8, 2, 256, 6144, 248320, True, 262144, 10000000.0, 1e-6, delta_heads=(16, 16, 128)),
    "4b": Shape(32, 2560, 16, 4, 256, 9216, 248320, True, 262144, 10000000.0, 1e-6, delta_heads=(16, 32, 128)),
    "9b": Shape(32, 4096, 16, 4, 256, 12288, 248320, False, 262144, 10000000.0, 1e-6, delta_heads=(16, 32, 128)),
}
FAMILIES["qwen35moe"] = {  # Qwen3.5-35B-A3B (256 experts, 8 used, and a shared expert), and it with half its layers
    "tiny": Shape(4, 256, 4, 2, 64, 0, 0, True, 262144, 10000000.0, 1e-6, 0.0, 8, 2, 128, delta_heads=(2, 4, 32),
                  shared_ffn=128),
    "half": Shape(20, 2048, 16, 2, 256, 0, 248320, False, 262144, 10000000.0, 1e-6, 0.0, 256, 8, 512,
                  delta_heads=(16, 32, 128), shared_ffn=512),
    "35b-a3b": Shape(40, 2048, 16, 2, 256, 0, 248320, False, 262144, 10000000.0, 1e-6, 0.0, 256, 8, 512,
                     delta_heads=(16, 32, 128), shared_ffn=512),
}
ARCH = {"llama3": "llama", "qwen3": "qwen3", "smollm3": "smollm3", "qwen3moe": "qwen3moe", "gpt-oss": "gpt-oss",
        "qwen35": "qwen35", "qwen35moe": "qwen35moe"}
PRE_TOKENIZER = {"llama3": "llama-bpe", "qwen3": "qwen2", "smollm3": "llama-bpe", "qwen3moe": "qwen2",
                 "gpt-oss": "gpt-4o", "qwen35": "qwen35", "qwen35moe": "qwen35"}
QWEN35_CONV, QWEN35_ATTENTION_EVERY, QWEN35_ROPE_FRACTION = 4, 4, 4  # conv taps; a full-attention layer every 4th;
# a quarter of each head's dims rotated
LLAMA3_LOW, LLAMA3_HIGH, LLAMA3_ORIGINAL = 1.0, 4.0, 8192
TOKEN_USER_DEFINED, TOKEN_UNUSED = 4, 5
CHUNK = 1 << 24  # weights generated at a time
BIAS_STD = 0.05  # gpt-oss's biases
QWEN3_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' %}"
    "{%- set content = message.content or '' %}"
    "{%- if '</think>' in content %}{%- set content = content.split('</think>')[-1].lstrip('\\n') %}{%- endif %}"
    "{{- '<|im_start|>assistant\\n' + content }}"
    "{%- if message.tool_calls %}{%- for call in message.tool_calls %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' + call.function.name + '\", \"arguments\": ' }}"
    "{{- (call.function.arguments if call.function.arguments is string else call.function.arguments | tojson) }}"
    "{{- '}\\n</tool_call>' }}{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)


def splitmix_uniform(start: int, count: int) -> np.ndarray:
    """`count` floats uniform in [-sqrt(3), sqrt(3)) (std 1) from splitmix64 of the counters start.. (exact)."""
    with np.errstate(over="ignore"):
        z = (np.arange(start, start + count, dtype=np.uint64) + np.uint64(0x5EED)) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    unit = (z >> np.uint64(40)).astype(np.float64) / float(1 << 24)  # (count,) in [0, 1), 24 bits
    return ((unit - 0.5) * (2 * 3 ** 0.5)).astype(np.float32)  # (count,)


def llama3_rope_factors(shape: Shape) -> np.ndarray:
    """llama.cpp's converter's `rope_freqs.weight` for rope_type llama3 (conversion/llama.py), float32 (Dh/2,)."""
    freqs = 1.0 / (np.float32(shape.rope_theta) ** (np.arange(0, shape.head_dim, 2, dtype=np.float32)
                                                     / np.float32(shape.head_dim)))  # (Dh/2,)
    low_wavelen, high_wavelen = LLAMA3_ORIGINAL / LLAMA3_LOW, LLAMA3_ORIGINAL / LLAMA3_HIGH
    factors = []
    for freq in freqs:
        wavelen = 2 * math.pi / float(freq)
        if wavelen < high_wavelen:
            factors.append(1.0)
        elif wavelen > low_wavelen:
            factors.append(shape.rope_factor)
        else:
            smooth = (LLAMA3_ORIGINAL / wavelen - LLAMA3_LOW) / (LLAMA3_HIGH - LLAMA3_LOW)
            factors.append(1 / ((1 - smooth) / shape.rope_factor + smooth))
    return np.asarray(factors, np.float32)  # (Dh/2,)


def tokenizer_fields(family: str, shape: Shape, source: Path) -> tuple[dict, int]:
    """SmolLM2's tokenizer keys with the family's pre-tokenizer, extra tokens and padding; the vocabulary size."""
    metadata = read_metadata(source)
    fields = {key: value for key, value in metadata.items() if key.startswith("tokenizer.")}
    tokens, types = list(fields["tokenizer.ggml.tokens"]), list(fields["tokenizer.ggml.token_type"])
    fields["tokenizer.ggml.pre"] = PRE_TOKENIZER[family]
    if family in ("qwen3", "qwen3moe", "qwen35", "qwen35moe"):
        tokens += ["<think>", "</think>"]
        types += [TOKEN_USER_DEFINED] * 2
        fields["tokenizer.chat_template"] = QWEN3_TEMPLATE
    if family == "gpt-oss":  # harmony's special tokens, template and o200k pre-tokenizer (bench/gpt_oss_tokens.py)
        from bench.gpt_oss_tokens import gpt_oss_tokenizer_fields

        fields = gpt_oss_tokenizer_fields(fields)
        tokens, types = list(fields["tokenizer.ggml.tokens"]), list(fields["tokenizer.ggml.token_type"])
    padding = max(0, shape.vocab - len(tokens))
    tokens += [f"<|unused_{i}|>" for i in range(padding)]
    types += [TOKEN_UNUSED] * padding
    fields["tokenizer.ggml.tokens"], fields["tokenizer.ggml.token_type"] = tokens, types
    return fields, len(tokens)


def tensor_plan(family: str, shape: Shape, vocab: int) -> list[tuple[str, tuple[int, ...], float]]:
    """(name, numpy shape, std) of every tensor in the converter's order; std 0 marks a norm weight (near 1)."""
    d, dh, ffn = shape.width, shape.head_dim, shape.ffn
    q_dim, kv_dim = shape.heads * dh, shape.kv_heads * dh
    output_std = 4.0 / math.sqrt(d)  # logits of a few units from unit-RMS hidden states
    branch = 1.0 / math.sqrt(2 * shape.layers)  # each block's writes into the residual stream (GPT-2's scaling)
    plan: list[tuple[str, tuple[int, ...], float]] = []
    if family == "llama3":
        plan.append(("rope_freqs.weight", (dh // 2,), -1.0))
    plan.append(("token_embd.weight", (vocab, d), output_std))
    for i in range(shape.layers):
        p = f"blk.{i}."
        if family in ("qwen35", "qwen35moe"):
            plan += qwen35_layer_plan(shape, i)
            continue
        biased = family == "gpt-oss"  # biases on attention, router and experts; sinks; a post-attention norm
        plan += [(p + "attn_norm.weight", (d,), 0.0)]
        for name, rows in (("attn_q", q_dim), ("attn_k", kv_dim), ("attn_v", kv_dim)):
            plan += [(p + name + ".weight", (rows, d), 1 / math.sqrt(d))] + (
                [(p + name + ".bias", (rows,), BIAS_STD)] if biased else [])
        plan.append((p + "attn_output.weight", (d, q_dim), branch / math.sqrt(q_dim)))
        if biased:
            plan += [(p + "attn_output.bias", (d,), BIAS_STD), (p + "attn_sinks.weight", (shape.heads,), 1.0)]
        if family in ("qwen3", "qwen3moe"):
            plan += [(p + "attn_k_norm.weight", (dh,), 0.0), (p + "attn_q_norm.weight", (dh,), 0.0)]
        plan.append((p + ("post_attention_norm.weight" if biased else "ffn_norm.weight"), (d,), 0.0))
        if shape.experts:  # the router (kept float32 by the converter) and the experts stacked (E, out, in)
            e, f = shape.experts, shape.expert_ffn
            parts = [("ffn_gate_inp", (e, d), 2 / math.sqrt(d), (e,)), ("ffn_gate_exps", (e, f, d), 1 / math.sqrt(d), (e, f)),
                     ("ffn_up_exps", (e, f, d), 1 / math.sqrt(d), (e, f)),
                     ("ffn_down_exps", (e, d, f), branch / math.sqrt(f), (e, d))]
            for name, dims, std, bias in parts:
                plan += [(p + name + ".weight", dims, std)] + ([(p + name + ".bias", bias, BIAS_STD)] if biased else [])
        else:
            plan += [(p + "ffn_gate.weight", (ffn, d), 1 / math.sqrt(d)), (p + "ffn_up.weight", (ffn, d), 1 / math.sqrt(d)),
                     (p + "ffn_down.weight", (d, ffn), branch / math.sqrt(ffn))]
    plan.append(("output_norm.weight", (d,), 0.0))
    if not shape.tied:
        plan.append(("output.weight", (vocab, d), output_std))
    return plan


def qwen35_layer_plan(shape: Shape, i: int) -> list[tuple[str, tuple[int, ...], float]]:
    """One Qwen3.5 block as llama.cpp's converter writes it: a gated delta-net (fused q/k/v, the output gate z, beta,
    alpha, the short convolution, dt bias, A = -exp(A_log), a per-head norm) or, every fourth, gated attention (each
    head's query rows followed by its gate rows); then a post-attention norm and the dense SwiGLU FFN."""
    d, dh, ffn = shape.width, shape.head_dim, shape.ffn
    hk, hv, dk = shape.delta_heads
    branch = 1.0 / math.sqrt(2 * shape.layers)
    p = f"blk.{i}."
    plan: list[tuple[str, tuple[int, ...], float]] = [(p + "attn_norm.weight", (d,), 0.0)]
    if (i + 1) % QWEN35_ATTENTION_EVERY:
        conv_dim = 2 * hk * dk + hv * dk
        plan += [(p + "attn_qkv.weight", (conv_dim, d), 1 / math.sqrt(d)), (p + "attn_gate.weight", (hv * dk, d), 1 / math.sqrt(d)),
                 (p + "ssm_conv1d.weight", (conv_dim, QWEN35_CONV), 1 / math.sqrt(QWEN35_CONV)),
                 (p + "ssm_dt.bias", (hv,), 0.5), (p + "ssm_a", (hv,), -2.0),
                 (p + "ssm_beta.weight", (hv, d), 1 / math.sqrt(d)), (p + "ssm_alpha.weight", (hv, d), 1 / math.sqrt(d)),
                 (p + "ssm_norm.weight", (dk,), 0.0), (p + "ssm_out.weight", (d, hv * dk), branch / math.sqrt(hv * dk))]
    else:
        q_dim, kv_dim = shape.heads * dh, shape.kv_heads * dh
        plan += [(p + "attn_q.weight", (2 * q_dim, d), 1 / math.sqrt(d)), (p + "attn_k.weight", (kv_dim, d), 1 / math.sqrt(d)),
                 (p + "attn_v.weight", (kv_dim, d), 1 / math.sqrt(d)),
                 (p + "attn_output.weight", (d, q_dim), branch / math.sqrt(q_dim)),
                 (p + "attn_q_norm.weight", (dh,), 0.0), (p + "attn_k_norm.weight", (dh,), 0.0)]
    plan.append((p + "post_attention_norm.weight", (d,), 0.0))
    if shape.experts:  # the router, the stacked experts and the shared expert with its gate vector
        e, f, fs = shape.experts, shape.expert_ffn, shape.shared_ffn
        return plan + [(p + "ffn_gate_inp.weight", (e, d), 2 / math.sqrt(d)),
                       (p + "ffn_gate_exps.weight", (e, f, d), 1 / math.sqrt(d)),
                       (p + "ffn_up_exps.weight", (e, f, d), 1 / math.sqrt(d)),
                       (p + "ffn_down_exps.weight", (e, d, f), branch / math.sqrt(f)),
                       (p + "ffn_gate_inp_shexp.weight", (d,), 1 / math.sqrt(d)),
                       (p + "ffn_gate_shexp.weight", (fs, d), 1 / math.sqrt(d)),
                       (p + "ffn_up_shexp.weight", (fs, d), 1 / math.sqrt(d)),
                       (p + "ffn_down_shexp.weight", (d, fs), branch / math.sqrt(fs))]
    return plan + [(p + "ffn_gate.weight", (ffn, d), 1 / math.sqrt(d)), (p + "ffn_up.weight", (ffn, d), 1 / math.sqrt(d)),
                   (p + "ffn_down.weight", (d, ffn), branch / math.sqrt(ffn))]


def write_f16(family: str, shape_name: str, seed: int, out: Path, tokenizer_source: Path) -> Path:
    """The twin in llama.cpp's F16 form (2-D weights float16, norms and rope_freqs float32), streamed tensor by tensor."""
    shape = FAMILIES[family][shape_name]
    arch = ARCH[family]
    fields, vocab = tokenizer_fields(family, shape, tokenizer_source)
    writer = GGUFWriter(str(out), arch)
    writer.add_type("model")
    writer.add_name(f"synthetic-{family}-{shape_name}")
    writer.add_block_count(shape.layers)
    writer.add_context_length(shape.context)
    writer.add_embedding_length(shape.width)
    if shape.ffn:  # Qwen3.5-MoE's config names no dense width
        writer.add_feed_forward_length(shape.ffn)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_rope_freq_base(shape.rope_theta)
    writer.add_layer_norm_rms_eps(shape.rms_eps)
    writer.add_key_length(shape.head_dim)
    writer.add_value_length(shape.head_dim)
    writer.add_file_type(1)  # mostly F16
    if family in ("llama3", "smollm3"):  # LlamaModel's keys
        writer.add_vocab_size(vocab)
        writer.add_rope_dimension_count(shape.head_dim)
    if shape.experts:  # Qwen3MoeModel's and GptOssModel's keys
        writer.add_expert_count(shape.experts)
        writer.add_expert_used_count(shape.experts_used)
        writer.add_expert_feed_forward_length(shape.expert_ffn)
    if shape.sliding_window:
        writer.add_sliding_window(shape.sliding_window)
    if shape.shared_ffn:
        writer.add_expert_shared_feed_forward_length(shape.shared_ffn)
    if family in ("qwen35", "qwen35moe"):  # Qwen3NextModel's keys and the interleaved M-RoPE sections ([11, 11, 10, 0] at 64 dims)
        hk, hv, dk = shape.delta_heads
        rope_dim = shape.head_dim // QWEN35_ROPE_FRACTION
        writer.add_ssm_conv_kernel(QWEN35_CONV)
        writer.add_ssm_state_size(dk)
        writer.add_ssm_group_count(hk)
        writer.add_ssm_time_step_rank(hv)
        writer.add_ssm_inner_size(hv * dk)
        writer.add_full_attention_interval(QWEN35_ATTENTION_EVERY)
        writer.add_rope_dimension_count(rope_dim)
        third = rope_dim // 2 // 3
        writer.add_rope_dimension_sections([third + 1, third + 1, rope_dim // 2 - 2 * third - 2, 0])
    if shape.yarn_original:  # rope_scaling {"rope_type": "yarn", beta_fast 32, beta_slow 1}
        writer.add_rope_scaling_type(RopeScalingType.YARN)
        writer.add_rope_scaling_factor(shape.rope_factor)
        writer.add_rope_scaling_orig_ctx_len(shape.yarn_original)
        writer.add_rope_scaling_yarn_beta_fast(32.0)
        writer.add_rope_scaling_yarn_beta_slow(1.0)
    for key, value in fields.items():
        if isinstance(value, list):
            writer.add_array(key, value)
        elif isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, str):
            writer.add_string(key, value)
        else:
            writer.add_uint32(key, int(value))
    writer.add_quantization_version(2)
    plan = tensor_plan(family, shape, vocab)
    for name, dims, _std in plan:  # infos first, then the data streamed one tensor at a time
        dtype = _file_dtype(name, dims)
        writer.add_tensor_info(name, dims, dtype, int(np.prod(dims)) * dtype.itemsize)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    counter = seed << 40
    for name, dims, std in plan:
        n = int(np.prod(dims))
        if std < 0 and name.endswith("ssm_a"):
            data = -np.exp(np.abs(splitmix_uniform(counter, n))).astype(np.float32)  # (Hv,) A = -exp(A_log) < 0
        elif std < 0:
            data = llama3_rope_factors(shape)  # (Dh/2,)
        elif std == 0:
            data = (1.0 + 0.2 * splitmix_uniform(counter, n)).astype(np.float32).reshape(dims)  # (D,) near 1
        else:
            data = np.empty(n, _file_dtype(name, dims))  # (n,) filled a chunk at a time (experts are large)
            for start in range(0, n, CHUNK):
                stop = min(n, start + CHUNK)
                data[start:stop] = splitmix_uniform(counter + start, stop - start) * np.float32(std)
            data = data.reshape(dims)  # (out, in) or (E, out, in)
        counter += n
        writer.write_tensor_data(data)
    writer.close()
    return out


def _file_dtype(name: str, dims: tuple[int, ...]) -> np.dtype:
    """float16 for matrices and stacked experts, float32 for vectors, biases, the router and the short convolution's
    taps (as the converter keeps them; ggml's ssm_conv reads float32)."""
    float32 = len(dims) < 2 or name.endswith(("ffn_gate_inp.weight", ".bias", "ssm_conv1d.weight"))
    return np.dtype(np.float32 if float32 else np.float16)


def llama_quantize() -> str:
    """llama.cpp's llama-quantize: $LLAMA_QUANTIZE, on PATH, or beside the llama-server of ../shared/peers."""
    candidates = [os.environ.get("LLAMA_QUANTIZE", ""), shutil.which("llama-quantize") or "",
                  str(Path.home() / ".cache/llmfleet-peers/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin/"
                      "llama-quantize")]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise SystemExit("llama-quantize not found: run ../shared/peers/make-synthetic-model.sh once (it builds it) "
                     "or set LLAMA_QUANTIZE")


def make_twin(family: str, shape: str, seed: int, kind: str, out: Path, tokenizer_source: Path) -> Path:
    """Write the twin at `out` (F16 directly; other types quantized from a temporary F16 by llama-quantize)."""
    if kind == "F16":
        return write_f16(family, shape, seed, out, tokenizer_source)
    f16 = out.with_name(out.name + ".f16.part")
    write_f16(family, shape, seed, f16, tokenizer_source)
    try:
        subprocess.run([llama_quantize(), str(f16), str(out) + ".part", kind, "2"], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        os.replace(str(out) + ".part", out)
    finally:
        f16.unlink(missing_ok=True)
    return out


def default_tokenizer_source() -> Path:
    """SmolLM2's GGUF in the model cache (`llmfleet pull smollm2-135m` puts it there)."""
    cache = Path(os.environ.get("LLMFLEET_CACHE", Path.home() / ".cache/llmfleet"))
    found = sorted((cache / "smollm2-135m").glob("*.gguf"))
    if not found:
        raise SystemExit("needs SmolLM2's GGUF for the tokenizer: run 'llmfleet pull smollm2-135m' first")
    return found[0]


def main() -> None:
    """Parse the arguments, write the twin, print its path."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", required=True, choices=sorted(FAMILIES))
    parser.add_argument("--shape", required=True, help="tiny, or a real size: " + "; ".join(
        f"{family}: {', '.join(shapes)}" for family, shapes in FAMILIES.items()))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--type", default="F16", choices=TYPES)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tokenizer-from", type=Path, default=None, help="SmolLM2's GGUF (default: the model cache)")
    args = parser.parse_args()
    if args.shape not in FAMILIES[args.family]:
        parser.error(f"--shape {args.shape!r}: {args.family} has {', '.join(FAMILIES[args.family])}")
    source = args.tokenizer_from or default_tokenizer_source()
    print(make_twin(args.family, args.shape, args.seed, args.type, args.out, source))


if __name__ == "__main__":
    main()
