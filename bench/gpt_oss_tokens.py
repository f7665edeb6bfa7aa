"""gpt-oss's tokenizer keys on SmolLM2's vocabulary: what a gpt-oss twin (or a SmolLM2 copy for llama-server's
/apply-template and /tokenize) needs to speak OpenAI's harmony chat format.

Real gpt-oss GGUFs (o200k_harmony) have `tokenizer.ggml.pre` "gpt-4o", `<|startoftext|>` as bos, `<|return|>` as eos,
`<|endoftext|>` as padding, no eot, and every harmony marker as a control token. llama.cpp (src/llama-vocab.cpp)
then ends generation on `<|return|>` and `<|call|>` (by their text), takes `<|end|>` out of that set because both are
there, and renders `<|channel|>`, `<|message|>`, `<|start|>`, `<|constrain|>` and `<|end|>` as text. The markers
take the ids of SmolLM2's own control tokens after `<|endoftext|>` (`<|im_start|>`, `<|im_end|>`, `<repo_name>`, ...),
so the vocabulary keeps its size: the model's embedding rows still match it. The chat template is OpenAI's, as
llama.cpp ships it (models/templates/openai-gpt-oss-120b.jinja, commit 0c1e570), in bench/gpt_oss_template.jinja.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

TEMPLATE_PATH = Path(__file__).with_name("gpt_oss_template.jinja")
TOKEN_NORMAL, TOKEN_CONTROL = 1, 3
ENDOFTEXT = "<|endoftext|>"
# gpt-oss's special tokens besides <|endoftext|>, in their o200k_harmony order (ids 199998, 200002, 200003, 200005,
# 200006, 200007, 200008, 200012 there)
HARMONY_TOKENS = ("<|startoftext|>", "<|return|>", "<|constrain|>", "<|channel|>", "<|start|>", "<|end|>",
                  "<|message|>", "<|call|>")
DROPPED_KEYS = ("tokenizer.ggml.unknown_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")


def gpt_oss_template() -> str:
    """The gpt-oss chat template (OpenAI's, as llama.cpp ships it)."""
    return TEMPLATE_PATH.read_text(encoding="utf-8")


def gpt_oss_tokenizer_fields(fields: dict[str, Any]) -> dict[str, Any]:
    """SmolLM2's `tokenizer.*` fields with gpt-oss's special tokens (in place of SmolLM2's control tokens, or
    appended where there are too few), bos/eos/padding as gpt-oss sets them, pre "gpt-4o" and the gpt-oss template."""
    out = {key: value for key, value in fields.items() if key not in DROPPED_KEYS}
    tokens, types = [str(t) for t in fields["tokenizer.ggml.tokens"]], [int(t) for t in fields["tokenizer.ggml.token_type"]]
    if ENDOFTEXT not in tokens:
        tokens.append(ENDOFTEXT)
        types.append(TOKEN_CONTROL)
    endoftext = tokens.index(ENDOFTEXT)
    free = [i for i, (text, kind) in enumerate(zip(tokens, types, strict=True))
            if kind == TOKEN_CONTROL and i != endoftext]
    for text in HARMONY_TOKENS:
        if text in tokens:
            continue
        if free:
            tokens[free.pop(0)] = text
        else:
            tokens.append(text)
            types.append(TOKEN_CONTROL)
    for i in range(len(tokens)):
        if tokens[i] in HARMONY_TOKENS:
            types[i] = TOKEN_CONTROL
    out["tokenizer.ggml.tokens"], out["tokenizer.ggml.token_type"] = tokens, types
    out["tokenizer.ggml.pre"] = "gpt-4o"
    out["tokenizer.ggml.bos_token_id"] = tokens.index("<|startoftext|>")
    out["tokenizer.ggml.eos_token_id"] = tokens.index("<|return|>")
    out["tokenizer.ggml.padding_token_id"] = endoftext
    out["tokenizer.ggml.add_bos_token"] = False
    out["tokenizer.chat_template"] = gpt_oss_template()
    return out
