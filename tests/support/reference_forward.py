"""An independent float64 forward of llama-, qwen3-, qwen3moe-, gpt-oss-, smollm3- and qwen35-family GGUF files, written
from llama.cpp's graphs (src/models/llama.cpp, qwen3.cpp, qwen3moe.cpp, openai-moe.cpp, smollm3.cpp, qwen35.cpp:
reference_hybrid.py), build_moe_ffn and
ggml's rope (with YaRN) and swiglu_oai, for parity tests:
plain numpy over the whole sequence, no KV cache, no folding, no fusing, nothing shared with the engine but the
file reader."""

from __future__ import annotations

import math

import numpy as np

from tests.support.reference_hybrid import delta_net, gated_attention
from worker.engine.formats.gguf_file import read_gguf


class ReferenceModel:
    """The file's weights as float64 and its forward pass: logits (T, V) of a token sequence."""

    def __init__(self, path: str) -> None:
        contents = read_gguf(path)
        self.arch = str(contents.metadata["general.architecture"])
        meta = {k[len(self.arch) + 1:]: v for k, v in contents.metadata.items() if k.startswith(self.arch + ".")}
        self.t = {name: np.asarray(array, np.float64) for name, array in contents.tensors.items()}
        self.meta = meta
        self.layers, self.heads = int(meta["block_count"]), int(meta["attention.head_count"])
        self.kv_heads = int(meta.get("attention.head_count_kv", self.heads))
        self.head_dim = int(meta.get("attention.key_length", int(meta["embedding_length"]) // self.heads))
        self.eps, self.base = float(meta["attention.layer_norm_rms_epsilon"]), float(meta.get("rope.freq_base", 1e4))
        self.experts_used = int(meta.get("expert_used_count", 0))
        self.window = int(meta.get("attention.sliding_window", 0))  # gpt-oss: even layers slide
        self.yarn = (float(meta["rope.scaling.factor"]), int(meta["rope.scaling.original_context_length"])) if (
            meta.get("rope.scaling.type") == "yarn") else None
        self.neox = self.arch not in ("llama", "smollm3")  # LlamaModel's converter permutes Q/K for adjacent pairs
        self.rope_dim = int(meta.get("rope.dimension_count", self.head_dim))  # Qwen3.5 rotates a quarter of a head
        interval = int(meta.get("full_attention_interval", 4 if self.arch.startswith("qwen35") else 0))
        self.recurrent = [bool(interval) and (i + 1) % interval != 0 for i in range(self.layers)]

    def _rms(self, x: np.ndarray, weight: np.ndarray) -> np.ndarray:
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + self.eps) * weight  # (..., D)

    def _rope(self, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """ggml_rope_ext without scaling: pair i of a head at position p turns by p * base^(-2i/Dh) / rope_freqs[i]."""
        half = self.rope_dim // 2
        inv = self.base ** (-2.0 * np.arange(half) / self.rope_dim)  # (R/2,)
        if "rope_freqs.weight" in self.t and self.arch == "llama":
            inv = inv / self.t["rope_freqs.weight"]
        angle = positions[:, None] * inv[None, :]  # (T, Dh/2)
        magnitude = 1.0
        if self.yarn is not None:  # ggml's rope_yarn: interpolated angles mixed with extrapolated ones by a ramp
            factor, original = self.yarn
            dims = self.head_dim

            def corr_dim(rotations: float) -> float:
                return dims * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(self.base))

            low, high = max(0.0, math.floor(corr_dim(32.0))), min(dims - 1.0, math.ceil(corr_dim(1.0)))
            ramp = 1 - np.clip((np.arange(half) - low) / max(0.001, high - low), 0, 1)  # (Dh/2,) 1: extrapolate
            angle = angle / factor * (1 - ramp) + angle * ramp  # (T, Dh/2)
            magnitude = 1.0 + 0.1 * math.log(factor)
        cos, sin = magnitude * np.cos(angle)[:, None, :], magnitude * np.sin(angle)[:, None, :]  # (T, 1, Dh/2)
        rest = x[..., self.rope_dim :]  # (T, H, Dh - R) not rotated
        x = x[..., : self.rope_dim]  # (T, H, R)
        first, second = (x[..., :half], x[..., half:]) if self.neox else (x[..., 0::2], x[..., 1::2])
        out = np.empty_like(x)  # (T, H, R)
        if self.neox:
            out[..., :half], out[..., half:] = first * cos - second * sin, first * sin + second * cos
        else:
            out[..., 0::2], out[..., 1::2] = first * cos - second * sin, first * sin + second * cos
        return np.concatenate([out, rest], axis=-1)  # (T, H, Dh)

    def _ffn(self, x: np.ndarray, p: str, kind: str, expert: int | None = None) -> np.ndarray:
        """SwiGLU FFN of x (T, D): the dense one (kind "") or one expert of the stacked ones (kind "_exps")."""
        gate_w, up_w, down_w = (self.t[f"{p}ffn_{part}{kind}.weight"] for part in ("gate", "up", "down"))
        if expert is not None:
            gate_w, up_w, down_w = gate_w[expert], up_w[expert], down_w[expert]  # (F, D), (F, D), (D, F)
        gate, up = x @ gate_w.T, x @ up_w.T  # (T, F) each
        return (gate / (1.0 + np.exp(-gate)) * up) @ down_w.T  # (T, D)

    def _routed_ffn(self, x: np.ndarray, p: str) -> np.ndarray:
        """The routed FFN of x (T, D). qwen3moe: softmax over the router's logits, the top k renormalised; gpt-oss:
        biased logits, the top k softmaxed among themselves, biased experts, swiglu_oai."""
        t, oai = self.t, self.arch == "gpt-oss"
        logits = x @ t[p + "ffn_gate_inp.weight"].T + t.get(p + "ffn_gate_inp.bias", 0.0)  # (T, E)
        probs = logits if oai else np.exp(logits - logits.max(-1, keepdims=True))  # (T, E)
        if not oai:
            probs = probs / probs.sum(-1, keepdims=True)
        out = np.zeros_like(x)  # (T, D)
        for row in range(x.shape[0]):
            chosen = np.argsort(-probs[row], kind="stable")[: self.experts_used]  # (k,)
            weights = np.exp(probs[row, chosen] - probs[row, chosen].max()) if oai else probs[row, chosen]  # (k,)
            weights = weights / weights.sum()
            for expert, weight in zip(chosen, weights):
                e = int(expert)
                if not oai:
                    out[row] += weight * self._ffn(x[row : row + 1], p, "_exps", e)[0]  # (D,)
                    continue
                gate = t[p + "ffn_gate_exps.weight"][e] @ x[row] + t[p + "ffn_gate_exps.bias"][e]  # (F,)
                up = t[p + "ffn_up_exps.weight"][e] @ x[row] + t[p + "ffn_up_exps.bias"][e]  # (F,)
                gate, up = np.minimum(gate, 7.0), np.clip(up, -7.0, 7.0)
                hidden = gate / (1.0 + np.exp(-1.702 * gate)) * (up + 1.0)  # (F,)
                out[row] += weight * (t[p + "ffn_down_exps.weight"][e] @ hidden + t[p + "ffn_down_exps.bias"][e])
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
            if self.arch.startswith("qwen35"):
                x = x + (delta_net(t, p, normed, self.meta, self.eps) if self.recurrent[layer] else gated_attention(
                    t, p, normed, (h, hk, dh), self._rms, lambda a: self._rope(a, positions)))  # (T, D)
                normed = self._rms(x, t[p + "post_attention_norm.weight"])  # (T, D)
                x = x + (self._ffn(normed, p, "") if p + "ffn_gate_inp.weight" not in t else self._routed_ffn(
                    normed, p) + self._ffn(normed, p, "_shexp") / (1.0 + np.exp(-normed @ t[p + "ffn_gate_inp_shexp.weight"]))[:, None])
                continue
            q = (normed @ t[p + "attn_q.weight"].T + t.get(p + "attn_q.bias", 0.0)).reshape(n, h, dh)  # (T, H, Dh)
            k = (normed @ t[p + "attn_k.weight"].T + t.get(p + "attn_k.bias", 0.0)).reshape(n, hk, dh)  # (T, Hkv, Dh)
            v = (normed @ t[p + "attn_v.weight"].T + t.get(p + "attn_v.bias", 0.0)).reshape(n, hk, dh)  # (T, Hkv, Dh)
            if p + "attn_q_norm.weight" in t:
                q, k = self._rms(q, t[p + "attn_q_norm.weight"]), self._rms(k, t[p + "attn_k_norm.weight"])
            if not (self.arch == "smollm3" and (layer + 1) % 4 == 0):  # SmolLM3's NoPE layers
                q, k = self._rope(q, positions), self._rope(k, positions)
            k, v = np.repeat(k, h // hk, axis=1), np.repeat(v, h // hk, axis=1)  # (T, H, Dh) each
            scores = np.einsum("thd,shd->hts", q, k) / math.sqrt(dh) + mask  # (H, T, T)
            if self.window and layer % 2 == 0:  # gpt-oss's sliding layers: keys within the window only
                distance = np.arange(n)[:, None] - np.arange(n)[None, :]  # (T, T)
                scores = scores + np.where(distance >= self.window, -np.inf, 0.0)  # (H, T, T)
            sinks = t.get(p + "attn_sinks.weight")  # (H,) a logit per head joining each softmax, no value
            top = scores.max(-1, keepdims=True) if sinks is None else np.maximum(scores.max(-1, keepdims=True),
                                                                                   sinks[:, None, None])
            weights = np.exp(scores - top)  # (H, T, T)
            total = weights.sum(-1, keepdims=True) + (0.0 if sinks is None else np.exp(sinks[:, None, None] - top))
            attended = np.einsum("hts,shd->thd", weights / total, v).reshape(n, h * dh)  # (T, H*Dh)
            x = x + attended @ t[p + "attn_output.weight"].T + t.get(p + "attn_output.bias", 0.0)  # (T, D)
            normed = self._rms(x, t.get(p + "ffn_norm.weight", t.get(p + "post_attention_norm.weight")))  # (T, D)
            x = x + (self._routed_ffn(normed, p) if p + "ffn_gate_inp.weight" in t else self._ffn(normed, p, ""))

        output = t.get("output.weight", t["token_embd.weight"])  # (V, D)
        return self._rms(x, t["output_norm.weight"]) @ output.T  # (T, V)
