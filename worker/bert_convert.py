"""Convert a sentence-transformers BERT directory (safetensors, no torch) to a GGUF in llama.cpp's `bert` layout.

The rules are those of llama.cpp's convert_hf_to_gguf.py for BertModel (../shared/fixtures/minilm/README.md):
tensors sorted by name and renamed with the BERT name map, no transposes; F16 output keeps 1-D tensors and the
position / token-type embeddings F32; the WordPiece vocabulary in llama.cpp's phantom-space form.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

SPM_SPACE = "\u2581"
TOKEN_NORMAL, TOKEN_CONTROL = 1, 3
POOLING_MEAN, POOLING_CLS, POOLING_LAST = 1, 2, 3
DROPPED = ("embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias")
KEPT_F32 = ("position_embd.weight", "token_types.weight")  # llama.cpp's converter never narrows these
_GLOBAL_NAMES = {
    "embeddings.word_embeddings": "token_embd",
    "embeddings.position_embeddings": "position_embd",
    "embeddings.token_type_embeddings": "token_types",
    "embeddings.LayerNorm": "token_embd_norm",
}
_LAYER_NAMES = {
    "attention.self.query": "attn_q",
    "attention.self.key": "attn_k",
    "attention.self.value": "attn_v",
    "attention.output.dense": "attn_output",
    "attention.output.LayerNorm": "attn_output_norm",
    "intermediate.dense": "ffn_up",
    "output.dense": "ffn_down",
    "output.LayerNorm": "layer_output_norm",
}
_LAYER_PATTERN = re.compile(r"^encoder\.layer\.(\d+)\.(.+)$")


class ConversionError(Exception):
    """The directory is not a BERT model this converter understands (the message says what is missing)."""


@dataclass(frozen=True)
class GeneralInfo:
    """The cosmetic general.* keys (llama.cpp derives them from the model card; here they are given)."""

    name: str
    version: str | None = None
    organization: str | None = None
    basename: str | None = None
    size_label: str | None = None


def gguf_tensor_name(name: str) -> str | None:
    """llama.cpp's BERT name of a safetensors tensor; None for one it drops; ConversionError if unknown."""
    name = name.removeprefix("bert.")
    stem, _, suffix = name.rpartition(".")
    if name in DROPPED:
        return None
    if stem in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[stem]}.{suffix}"
    match = _LAYER_PATTERN.match(stem)
    if match and match.group(2) in _LAYER_NAMES:
        return f"blk.{match.group(1)}.{_LAYER_NAMES[match.group(2)]}.{suffix}"
    raise ConversionError(f"tensor {name!r} has no place in llama.cpp's bert layout")


def phantom_vocabulary(tokenizer_json: dict[str, Any]) -> tuple[list[str], list[int]]:
    """Tokens in id order in llama.cpp's WPM form (`##x` -> `x`, others `▁x`; added tokens verbatim) and types."""
    model = tokenizer_json.get("model") or {}
    if model.get("type") != "WordPiece":
        raise ConversionError(f"tokenizer model {model.get('type')!r} is not WordPiece")
    vocab: dict[str, int] = model["vocab"]
    prefix = model.get("continuing_subword_prefix") or "##"
    tokens: list[str | None] = [None] * len(vocab)
    for text, token_id in vocab.items():
        tokens[token_id] = text
    if any(t is None for t in tokens):
        raise ConversionError("the vocabulary has gaps in its ids")
    added = {int(t["id"]) for t in tokenizer_json.get("added_tokens") or [] if t.get("special")}
    out, types = [], []
    for token_id, text in enumerate(tokens):
        assert text is not None
        if token_id in added:
            out.append(text)
            types.append(TOKEN_CONTROL)
        else:
            out.append(text[len(prefix):] if text.startswith(prefix) else SPM_SPACE + text)
            types.append(TOKEN_NORMAL)
    return out, types


def pooling_type(directory: Path) -> int:
    """The pooling sentence-transformers' modules.json declares (1 mean, 2 CLS, 3 last token); mean if none."""
    modules_path = directory / "modules.json"
    if not modules_path.is_file():
        return POOLING_MEAN
    for module in json.loads(modules_path.read_text(encoding="utf-8")):
        if str(module.get("type", "")).endswith("Pooling"):
            config = json.loads((directory / module.get("path", "") / "config.json").read_text(encoding="utf-8"))
            if config.get("pooling_mode_mean_tokens"):
                return POOLING_MEAN
            if config.get("pooling_mode_cls_token"):
                return POOLING_CLS
            if config.get("pooling_mode_lasttoken"):
                return POOLING_LAST
            raise ConversionError(f"pooling {config} is not mean, CLS or last token")
    return POOLING_MEAN


def _json(directory: Path, name: str) -> dict[str, Any]:
    """A JSON file of the model directory, or ConversionError naming it."""
    path = directory / name
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConversionError(f"{path}: cannot read it ({type(exc).__name__}: {exc})") from None


def _special_ids(directory: Path, tokenizer_json: dict[str, Any]) -> dict[str, int]:
    """cls/sep/pad/unk/mask ids named by tokenizer_config.json (bos = cls, eos = sep when it names neither)."""
    config = _json(directory, "tokenizer_config.json") if (directory / "tokenizer_config.json").is_file() else {}
    vocab = tokenizer_json["model"]["vocab"]
    ids: dict[str, int] = {}
    for role, default in (("cls", "[CLS]"), ("sep", "[SEP]"), ("pad", "[PAD]"), ("unk", "[UNK]"),
                          ("mask", "[MASK]"), ("bos", None), ("eos", None)):
        text = config.get(f"{role}_token", default)
        text = text.get("content") if isinstance(text, dict) else text
        if isinstance(text, str) and text in vocab:
            ids[role] = int(vocab[text])
    ids.setdefault("bos", ids.get("cls", 101))
    ids.setdefault("eos", ids.get("sep", 102))
    return ids


FILE_TYPES = {"f32": 0, "f16": 1, "q8_0": 7}  # general.file_type (llama_ftype) of each outtype


def _add_tensor(writer: Any, name: str, array: np.ndarray, outtype: str) -> None:
    """Add one tensor: 1-D ones and the position / token-type tables stay F32; matrices become outtype."""
    import gguf
    from gguf.quants import quantize

    narrow = outtype != "f32" and array.ndim == 2 and name not in KEPT_F32
    if narrow and outtype == "q8_0" and array.shape[1] % 32 == 0:
        data = quantize(np.ascontiguousarray(array, np.float32), gguf.GGMLQuantizationType.Q8_0)
        writer.add_tensor(name, data, raw_shape=data.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        return
    dtype = np.float16 if narrow else np.float32
    writer.add_tensor(name, np.ascontiguousarray(array.astype(dtype)))


def _add_model_keys(writer: Any, config: dict[str, Any], general: GeneralInfo, outtype: str, pooling: int) -> None:
    """The `general.*` and `bert.*` keys, in the order llama.cpp's converter writes them."""
    import gguf

    writer.add_type("model")
    writer.add_name(general.name)
    for value, add in ((general.version, writer.add_version), (general.organization, writer.add_organization),
                       (general.basename, writer.add_basename), (general.size_label, writer.add_size_label)):
        if value:
            add(value)
    writer.add_block_count(int(config["num_hidden_layers"]))
    writer.add_context_length(int(config["max_position_embeddings"]))
    writer.add_embedding_length(int(config["hidden_size"]))
    writer.add_feed_forward_length(int(config["intermediate_size"]))
    writer.add_head_count(int(config["num_attention_heads"]))
    writer.add_layer_norm_eps(float(config.get("layer_norm_eps", 1e-12)))
    writer.add_file_type(FILE_TYPES[outtype])
    writer.add_causal_attention(False)
    writer.add_pooling_type(gguf.PoolingType(pooling))
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_token_type_count(int(config.get("type_vocab_size", 2)))


def _add_tokenizer_keys(writer: Any, tokens: list[str], token_types: list[int], special: dict[str, int],
                        tokenizer_json: dict[str, Any]) -> None:
    """The `tokenizer.ggml.*` keys: the phantom-space vocabulary, its special ids and the normalizer's flags."""
    writer.add_tokenizer_model("bert")
    writer.add_tokenizer_pre("bert-bge")
    writer.add_token_list(tokens)
    writer.add_token_types(token_types)
    writer.add_bos_token_id(special["bos"])
    writer.add_eos_token_id(special["eos"])
    writer.add_unk_token_id(special.get("unk", 100))
    writer.add_sep_token_id(special.get("sep", special["eos"]))
    writer.add_pad_token_id(special.get("pad", 0))
    if "mask" in special:
        writer.add_mask_token_id(special["mask"])
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(True)
    writer.add_add_sep_token(False)
    normalizer = tokenizer_json.get("normalizer") or {}
    if normalizer.get("lowercase") is not None:
        writer.add_bool("tokenizer.ggml.normalizer.lowercase", bool(normalizer["lowercase"]))
    if normalizer.get("strip_accents") is not None:
        writer.add_bool("tokenizer.ggml.normalizer.strip_accents", bool(normalizer["strip_accents"]))


def convert(directory: str | Path, dest: str | Path, *, outtype: str = "f32", general: GeneralInfo | None = None) -> Path:
    """Write `dest` (GGUF, `bert` architecture) from a sentence-transformers directory; outtype f32, f16 or q8_0
    (matrices whose rows are not a multiple of 32 stay F16 then)."""
    import gguf
    from safetensors.numpy import load_file

    directory, dest = Path(directory), Path(dest)
    if outtype not in FILE_TYPES:
        raise ConversionError(f"outtype {outtype!r}: one of {', '.join(FILE_TYPES)}")
    config = _json(directory, "config.json")
    tokenizer_json = _json(directory, "tokenizer.json")
    tensors = load_file(str(directory / "model.safetensors"))
    renamed = [(gguf_tensor_name(name), array) for name, array in sorted(tensors.items())]
    tokens, token_types = phantom_vocabulary(tokenizer_json)
    special = _special_ids(directory, tokenizer_json)
    writer = gguf.GGUFWriter(str(dest), "bert")
    _add_model_keys(writer, config, general or GeneralInfo(name=directory.name), outtype, pooling_type(directory))
    _add_tokenizer_keys(writer, tokens, token_types, special, tokenizer_json)
    for name, array in renamed:
        if name is None:
            continue
        _add_tensor(writer, name, array, outtype)
    dest.parent.mkdir(parents=True, exist_ok=True)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dest
