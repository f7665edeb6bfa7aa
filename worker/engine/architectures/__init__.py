"""Architecture registry: GGUF `general.architecture` name -> Architecture."""

from __future__ import annotations

from worker.engine.architectures.base import Architecture, Encoder
from worker.engine.architectures.bert import Bert
from worker.engine.architectures.gemma3 import Gemma3
from worker.engine.architectures.gpt_oss import GptOss
from worker.engine.architectures.llama import Llama
from worker.engine.architectures.qwen2 import Qwen2
from worker.engine.architectures.qwen3 import Qwen3
from worker.engine.architectures.qwen3moe import Qwen3MoE
from worker.engine.architectures.qwen35 import Qwen35
from worker.engine.architectures.qwen35moe import Qwen35MoE
from worker.engine.architectures.smollm3 import SmolLM3
from worker.engine.errors import ModelLoadError
from worker.engine.formats.config import ModelConfig

ARCHITECTURES: dict[str, Architecture | Encoder] = {
    arch.name: arch for arch in (Llama(), Qwen2(), Qwen3(), Qwen3MoE(), GptOss(), Qwen35(), Qwen35MoE(), SmolLM3(), Gemma3(), Bert())}


def architecture_for(config: ModelConfig, path: str) -> Architecture | Encoder:
    """The architecture of a file, or ModelLoadError naming it and the supported ones."""
    arch = ARCHITECTURES.get(config.architecture)
    if arch is None:
        supported = ", ".join(sorted(ARCHITECTURES))
        raise ModelLoadError(path, f"unsupported architecture {config.architecture!r} (supported: {supported})")
    return arch
