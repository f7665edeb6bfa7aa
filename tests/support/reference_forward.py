"""An independent float64 forward of llama-, qwen3-, qwen3moe- and smollm3-family GGUF files, written from
llama.cpp's graphs (src/models/llama.cpp, qwen3.cpp, qwen3moe.cpp, smollm3.cpp) and ggml's rope, for parity tests:
plain numpy over the whole sequence, no KV cache, no folding, no fusing, nothing shared with the engine but the
file reader."""

from __future__ import annotations

import math

import numpy as np

from worker.engine.gguf_file import read_gguf


class ReferenceModel:
    """The file's weights as float64 and its forward pass: logits (T, V) of a token sequence."""

    def __init__(self, path: str) -> None:
        contents = read_gguf(path)
        self.arch = str(contents.metadata["general.architecture"])
        meta = {k[len(self.arch) + 1:]: v for k, v in contents.metadata.items() if k.startswith(self.arch + ".")}
        self.t = {name: np.asarray(array, np.float64) for name, array in contents.tensors.items()}
        self.layers, self.heads = int(meta["block_count"]), int(meta["attention.head_count"])
        self.kv_heads = int(meta.get("attention.head_count_kv", self.heads))
        self.head_dim = int(meta.get("attention.key_length", int(meta["embedding_length"]) // self.heads))
        self.eps, self.base = float(meta["attention.layer_norm_rms_epsilon"]), float(meta.get("rope.freq_base", 1e4))
        self.experts_used = int(meta.get("expert_used_count", 0))
        self.neox = self.arch not in ("llama", "smollm3")  # LlamaModel's converter permutes Q/K for adjacent pairs

    def _rms(self, x: np.ndarray, weight: np.ndarray) -> np.ndarray:
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + self.eps) * weight  # (..., D)

    def _rope(self, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """ggml_rope_ext without scaling: pair i of a head at position p turns by p * base^(-2i/Dh) / rope_freqs[i]."""
        half = self.head_dim // 2
        inv = self.base ** (-2.0 * np.arange(half) / self.head_dim)  # (Dh/2,)
        if "rope_freqs.weight" in self.t and self.arch == "llama":
            inv = inv / self.t["rope_freqs.weight"]
        angle = positions[:, None] * inv[None, :]  # (T, Dh/2)
        cos, sin = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]  # (T, 1, Dh/2)
        first, second = (x[..., :half], x[..., half:]) if self.neox else (x[..., 0::2], x[..., 1::2])
        out = np.empty_like(x)  # (T, H, Dh)
        if self.neox:
            out[..., :half], out[..., half:] = first * cos - second * sin, first * sin + second * cos
        else:
            out[..., 0::2], out[..., 1::2] = first * cos - second * sin, first * sin + second * cos
        return out

    def _ffn(self, x: np.ndarray, p: str, kind: str, expert: int | None = None) -> np.ndarray:
        """SwiGLU FFN of x (T, D): the dense one (kind "") or one expert of the stacked ones (kind "_exps")."""
        gate_w, up_w, down_w = (self.t[f"{p}ffn_{part}{kind}.weight"] for part in ("gate", "up", "down"))
        if expert is not None:
            gate_w, up_w, down_w = gate_w[expert], up_w[expert], down_w[expert]  # (F, D), (F, D), (D, F)
        gate, up = x @ gate_w.T, x @ up_w.T  # (T, F) each
        return (gate / (1.0 + np.exp(-gate)) * up) @ down_w.T  # (T, D)

    def _routed_ffn(self, x: np.ndarray, p: str) -> np.ndarray:
        """qwen3moe's FFN of x (T, D): softmax over the router's logits, the top k renormalised, experts summed."""
        logits = x @ self.t[p + "ffn_gate_inp.weight"].T  # (T, E)
        probs = np.exp(logits - logits.max(-1, keepdims=True))  # (T, E)
        probs /= probs.sum(-1, keepdims=True)
        out = np.zeros_like(x)  # (T, D)
        for row in range(x.shape[0]):
            chosen = np.argsort(-probs[row], kind="stable")[: self.experts_used]  # (k,)
            weights = probs[row, chosen] / probs[row, chosen].sum()  # (k,)
            for expert, weight in zip(chosen, weights):
                out[row] += weight * self._ffn(x[row : row + 1], p, "_exps", int(expert))[0]  # (D,)
        return out

    def logits(self, ids: list[int]) -> np.ndarray:
        """Logits (T, V) of every position of a sequence, in float64."""
        t, n, h, hk, dh = self.t, len(ids), self.heads, self.kv_heads, self.head_dim
        x = t["token_embd.weight"][ids]  # (T, D)
        positions = np.arange(n, dtype=np.float64)  # (T,)
        mask = np.triu(np.full((n, n), -np.inf), 1)  # (T, T)
        for layer in range(self.layers):
            p = f"blk.{layer}."
            normed = self._rms(x, t[p + "attn_norm.weight"])  # (T, D)
            q = (normed @ t[p + "attn_q.weight"].T).reshape(n, h, dh)  # (T, H, Dh)
            k = (normed @ t[p + "attn_k.weight"].T).reshape(n, hk, dh)  # (T, Hkv, Dh)
            v = (normed @ t[p + "attn_v.weight"].T).reshape(n, hk, dh)  # (T, Hkv, Dh)
            if p + "attn_q_norm.weight" in t:
                q, k = self._rms(q, t[p + "attn_q_norm.weight"]), self._rms(k, t[p + "attn_k_norm.weight"])
            if not (self.arch == "smollm3" and (layer + 1) % 4 == 0):  # SmolLM3's NoPE layers
                q, k = self._rope(q, positions), self._rope(k, positions)
            k, v = np.repeat(k, h // hk, axis=1), np.repeat(v, h // hk, axis=1)  # (T, H, Dh) each
            scores = np.einsum("thd,shd->hts", q, k) / math.sqrt(dh) + mask  # (H, T, T)
            weights = np.exp(scores - scores.max(-1, keepdims=True))  # (H, T, T)
            weights /= weights.sum(-1, keepdims=True)
            attended = np.einsum("hts,shd->thd", weights, v).reshape(n, h * dh)  # (T, H*Dh)
            x = x + attended @ t[p + "attn_output.weight"].T  # (T, D)
            normed = self._rms(x, t[p + "ffn_norm.weight"])  # (T, D)
            x = x + (self._routed_ffn(normed, p) if p + "ffn_gate_inp.weight" in t else self._ffn(normed, p, ""))

        output = t.get("output.weight", t["token_embd.weight"])  # (V, D)
        return self._rms(x, t["output_norm.weight"]) @ output.T  # (T, V)
