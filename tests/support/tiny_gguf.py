"""Write tiny random-weight GGUF files with gguf.GGUFWriter, for fast engine tests."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from worker.engine.text.tokenizer import byte_level_alphabet

D_MODEL, N_HEADS, N_KV_HEADS, D_FF, N_LAYERS, CONTEXT = 32, 4, 2, 64, 2, 2048
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a"]


def tiny_vocab() -> tuple[list[str], list[int], list[str]]:
    """Byte-level vocab: special tokens, the 256 byte symbols, then the merge results."""
    alphabet = byte_level_alphabet()
    tokens = SPECIALS + [alphabet[b] for b in range(256)] + [m.replace(" ", "") for m in MERGES]
    types = [3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS))
    return tokens, types, MERGES


def write_tiny_gguf(path: Path, *, arch: str = "llama", drop: str | None = None, seed: int = 0,
                    tied: bool = True) -> Path:
    """A 2-layer random llama-style model with a byte-level tokenizer; `drop` omits one tensor."""
    rng = np.random.default_rng(seed)
    tokens, types, merges = tiny_vocab()
    vocab = len(tokens)
    head_dim = D_MODEL // N_HEADS
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(N_LAYERS)
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(D_MODEL)
    writer.add_feed_forward_length(D_FF)
    writer.add_head_count(N_HEADS)
    writer.add_head_count_kv(N_KV_HEADS)
    writer.add_rope_freq_base(10000.0)
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(0)
    writer.add_add_bos_token(False)

    def w(*shape: int, scale: float = 0.2) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    tensors: dict[str, np.ndarray] = {
        "token_embd.weight": w(vocab, D_MODEL, scale=1.0),
        "output_norm.weight": 1.0 + w(D_MODEL, scale=0.1),
    }
    if not tied:
        tensors["output.weight"] = w(vocab, D_MODEL)
    for i in range(N_LAYERS):
        p = f"blk.{i}."
        tensors.update({
            p + "attn_norm.weight": 1.0 + w(D_MODEL, scale=0.1),
            p + "attn_q.weight": w(N_HEADS * head_dim, D_MODEL),
            p + "attn_k.weight": w(N_KV_HEADS * head_dim, D_MODEL),
            p + "attn_v.weight": w(N_KV_HEADS * head_dim, D_MODEL),
            p + "attn_output.weight": w(D_MODEL, N_HEADS * head_dim),
            p + "ffn_norm.weight": 1.0 + w(D_MODEL, scale=0.1),
            p + "ffn_gate.weight": w(D_FF, D_MODEL),
            p + "ffn_up.weight": w(D_FF, D_MODEL),
            p + "ffn_down.weight": w(D_MODEL, D_FF),
        })
    for name, array in tensors.items():
        if name == drop:
            continue
        if name == "token_embd.weight":  # exercise a quantized type on load
            writer.add_tensor(name, gguf.quants.quantize(array, gguf.GGMLQuantizationType.Q8_0),
                              raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
