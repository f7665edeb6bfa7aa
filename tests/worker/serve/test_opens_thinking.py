"""A chat template whose generation prompt ends inside a thinking block (newer DeepSeek-R1 templates) is detected
at load, published in the worker's registry entry, and starts the stop-string matcher inside the block."""

from __future__ import annotations

from typing import Any

import fakeredis

from shared import keys
from shared.registry import RegistryEntry
from worker.engine.engine import Engine
from worker.engine.text.chat_template import CHATML_TEMPLATE, ChatTemplate
from worker.serve.heartbeat import Heartbeat

THINKING_TEMPLATE = CHATML_TEMPLATE.replace("<|im_start|>assistant\\n", "<|im_start|>assistant\\n<think>\\n")


def _with_template(engine: Engine, source: str) -> Engine:
    return Engine(engine.model, engine.tokenizer, ChatTemplate.from_source(source, engine.tokenizer))


def test_the_template_is_probed(tiny_chat_engine: Any) -> None:
    assert THINKING_TEMPLATE != CHATML_TEMPLATE, "the ChatML template's generation prompt changed"
    assert tiny_chat_engine.opens_thinking is False
    assert _with_template(tiny_chat_engine, THINKING_TEMPLATE).opens_thinking is True


def test_the_registry_entry_says_so() -> None:
    client = fakeredis.FakeRedis()
    beat = Heartbeat(client, worker_id="w1", model="m", slots=1, interval_s=1.0, ttl_s=3.0, gauges=dict,
                     held_jobs=list, opens_thinking=True, harmony=True)
    beat.beat()
    entry = RegistryEntry.from_hash("w1", client.hgetall(keys.worker_key("w1")))
    assert entry is not None and entry.opens_thinking is True and entry.harmony is True
    bare = RegistryEntry.from_hash("w0", {b"model": b"m", b"heartbeat": b"1", b"version": b"1"})
    assert bare is not None and bare.opens_thinking is False and bare.harmony is False


def test_a_harmony_template_is_detected(tiny_chat_engine: Any) -> None:
    """gpt-oss's template (its source writes `<|channel|>`): published as `harmony`, and it opens no block."""
    from bench.gpt_oss_tokens import gpt_oss_template

    assert tiny_chat_engine.harmony is False
    harmony = _with_template(tiny_chat_engine, gpt_oss_template())
    assert harmony.harmony is True and harmony.opens_thinking is False and harmony.thinks is False
