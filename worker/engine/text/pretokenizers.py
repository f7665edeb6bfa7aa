"""Pre-tokenizers: how each `tokenizer.ggml.pre` name splits text before byte-level BPE (llama.cpp's table)."""

from __future__ import annotations

from dataclasses import dataclass

from tokenizers import Regex, pre_tokenizers

# llama.cpp's pre-tokenizer regexes (llama-vocab.cpp), applied one after another.
GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
LLAMA3_REGEX = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_REGEX = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN35_REGEX = (  # Qwen2's with combining marks (\p{M}) kept inside words
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# GPT-4o's (o200k: gpt-oss, Llama 4): llama.cpp's form of tokenizer.json's regex, where a letter that is not a-z stands
# for "upper case" and one that is not A-Z for "lower case" (what its collapsed-codepoint std::regex can express).
GPT4O_REGEX = (
    r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?"
    r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
DEFAULT_REGEXES = (r"[\p{P}\$\+<=>\^~\|]+", GPT2_REGEX, r"\p{N}+", r"[0-9][0-9][0-9]")


@dataclass(frozen=True)
class PreTokenizerSpec:
    """How one `tokenizer.ggml.pre` name splits text before byte-level BPE."""

    regexes: tuple[str, ...]  # applied in order, each keeping matches and gaps as pieces
    individual_digits_then_gpt2: bool = False  # the starcoder/smollm form: Digits + ByteLevel(use_regex)
    ignore_merges: bool = False  # whole pieces found in the vocabulary skip the merges (llama3)


PRE_TOKENIZERS: dict[str, PreTokenizerSpec] = {
    "gpt2": PreTokenizerSpec((GPT2_REGEX,)),
    "default": PreTokenizerSpec(DEFAULT_REGEXES),
    "smollm": PreTokenizerSpec((), individual_digits_then_gpt2=True),
    "starcoder": PreTokenizerSpec((), individual_digits_then_gpt2=True),
    "refact": PreTokenizerSpec((), individual_digits_then_gpt2=True),
    "llama3": PreTokenizerSpec((LLAMA3_REGEX,), ignore_merges=True),
    "llama-bpe": PreTokenizerSpec((LLAMA3_REGEX,), ignore_merges=True),
    "qwen2": PreTokenizerSpec((QWEN2_REGEX,)),
    "qwen35": PreTokenizerSpec((QWEN35_REGEX,)),
    "gpt-4o": PreTokenizerSpec((GPT4O_REGEX,)),  # gpt-oss (o200k_harmony)
}


def byte_level_pre_tokenizer(spec: PreTokenizerSpec) -> pre_tokenizers.PreTokenizer:
    """The HF pre-tokenizer chain for one byte-level BPE split spec."""
    if spec.individual_digits_then_gpt2:
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
    steps: list[pre_tokenizers.PreTokenizer] = [
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False) for pattern in spec.regexes
    ]
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
    return pre_tokenizers.Sequence(steps)
