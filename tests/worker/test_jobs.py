"""worker.jobs: a chat job for a model without a chat template is a clear 400; a configured template is used."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from shared.errors import NoChatTemplate
from shared.messages import ChatMessage, GenerateJob
from worker.jobs import prompt_ids_of

TEMPLATE = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}>{% endif %}"


def _chat_job() -> GenerateJob:
    now = time.time()
    return GenerateJob(id="job-1", model="tiny", created=now, deadline=now + 60,
                       messages=[ChatMessage(role="user", content="hello")])


def test_chat_on_a_model_without_a_template_is_a_400_naming_the_fix(tiny_engine: Any) -> None:
    assert tiny_engine.chat_template is None  # the tiny GGUF, like a base model, has no template
    with pytest.raises(NoChatTemplate) as caught:
        prompt_ids_of(tiny_engine, _chat_job())
    error = caught.value
    assert (error.status, error.code, error.param) == (400, "no_chat_template", "messages")
    assert "'tiny' has no chat template" in error.message and "--chat-template" in error.message


def test_a_configured_template_renders_chat(tmp_path: Path) -> None:
    from tiny_gguf import write_tiny_gguf

    from worker.engine.engine import Engine

    engine = Engine.load(write_tiny_gguf(tmp_path / "tiny.gguf"), chat_template=TEMPLATE)
    ids = prompt_ids_of(engine, _chat_job())
    assert engine.tokenizer.decode(ids) == "[user] hello\n>"
