"""echo + logprobs end to end with the unmodified `openai` client on real processes (two SmolLM2 workers): the
prompt tokens' logprobs as OpenAI's legacy completions give them, equal to a teacher-forced forward."""

from __future__ import annotations

from typing import Any

import numpy as np
import openai
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.integration]
MODEL = "smollm2-135m"
# longer than the default prefill chunk (LLMFLEET_MAX_PREFILL_TOKENS 512), with characters of 2 and 3 UTF-8 bytes
PROMPT = "".join(f"Entry {i}: the café by the naïve harbour sold 日本 tea at dawn. " for i in range(40))


@pytest.fixture()
def client(cluster: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=cluster.base_url + "/v1", api_key="unused", max_retries=0, timeout=300)


def teacher_forced(engine: Any, ids: list[int]) -> np.ndarray:
    """Every prompt position's log-softmax (L, V), the whole prompt in one forward."""
    from worker.engine.forward_batch import BatchEntry
    from worker.engine.kv.pool import KVPool

    pool = KVPool(engine.model.config, 1024, 16, enable_prefix_caching=False)
    pool.ensure(0, len(ids))
    logits = np.asarray(engine.model.forward([BatchEntry(0, np.array(ids), 0, "all")], pool)[0], np.float64)
    peak = logits.max(axis=1, keepdims=True)
    return logits - peak - np.log(np.exp(logits - peak).sum(axis=1, keepdims=True))


def check_offsets(text: str, tokens: list[str], offsets: list[int]) -> None:
    """Offsets point into the returned text: non-decreasing, and a token that is whole characters is there."""
    assert offsets[0] == 0 and offsets == sorted(offsets) and offsets[-1] < len(text)
    for token, offset in zip(tokens, offsets):
        if "\ufffd" not in token:
            assert text[offset : offset + len(token)] == token


def test_echo_logprobs_cover_the_prompt_then_the_completion(client: openai.OpenAI, smollm2_engine: Any) -> None:
    ids = smollm2_engine.encode_prompt(PROMPT)
    assert len(ids) > 512
    reply = client.completions.create(model=MODEL, prompt=PROMPT, echo=True, logprobs=3, max_tokens=4, n=2,
                                      temperature=0, extra_body={"ignore_eos": True})
    plain = client.completions.create(model=MODEL, prompt=PROMPT, logprobs=3, max_tokens=4, temperature=0,
                                      extra_body={"ignore_eos": True})
    reference = teacher_forced(smollm2_engine, ids)
    assert reply.usage.prompt_tokens == len(ids) and reply.usage.completion_tokens == 8
    for choice in reply.choices:
        lp = choice.logprobs
        assert choice.text == PROMPT + plain.choices[0].text
        assert len(lp.tokens) == len(ids) + 4 and lp.tokens[len(ids):] == plain.choices[0].logprobs.tokens
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
        expected = [reference[p - 1, ids[p]] for p in range(1, len(ids))]
        np.testing.assert_allclose(lp.token_logprobs[1 : len(ids)], expected, atol=2e-3)
        best = smollm2_engine.tokenizer.token_bytes(int(np.argmax(reference[9]))).decode("utf-8", errors="replace")
        assert len(lp.top_logprobs[10]) <= 3 and best in lp.top_logprobs[10]
        np.testing.assert_allclose(lp.token_logprobs[len(ids):], plain.choices[0].logprobs.token_logprobs, atol=1e-4)
        check_offsets(choice.text, lp.tokens, lp.text_offset)
        assert lp.text_offset[len(ids)] == len(PROMPT)  # the completion starts right after the echoed prompt


def test_streamed_echo_logprobs_equal_the_collected_ones(client: openai.OpenAI) -> None:
    prompt = PROMPT[:200]
    whole = client.completions.create(model=MODEL, prompt=prompt, echo=True, logprobs=2, max_tokens=3,
                                      temperature=0, extra_body={"ignore_eos": True}).choices[0]
    text, tokens, token_logprobs, top, offsets = "", [], [], [], []
    for chunk in client.completions.create(model=MODEL, prompt=prompt, echo=True, logprobs=2, max_tokens=3,
                                           temperature=0, stream=True, extra_body={"ignore_eos": True}):
        for choice in chunk.choices:
            text += choice.text
            if choice.logprobs is not None:
                tokens += choice.logprobs.tokens
                token_logprobs += choice.logprobs.token_logprobs
                top += choice.logprobs.top_logprobs
                offsets += choice.logprobs.text_offset
    assert text == whole.text and text.startswith(prompt)
    assert tokens == whole.logprobs.tokens and offsets == whole.logprobs.text_offset
    assert token_logprobs[0] is None and top[0] is None
    np.testing.assert_allclose(token_logprobs[1:], whole.logprobs.token_logprobs[1:], atol=1e-4)


def test_max_tokens_zero_scores_the_prompt(client: openai.OpenAI) -> None:
    reply = client.completions.create(model=MODEL, prompt="The sky is blue", echo=True, logprobs=1, max_tokens=0)
    choice = reply.choices[0]
    assert choice.text == "The sky is blue" and choice.finish_reason == "length"
    assert choice.logprobs.token_logprobs[0] is None and all(v < 0 for v in choice.logprobs.token_logprobs[1:])
    assert reply.usage.completion_tokens == 0


def test_a_prompt_over_the_scoring_limit_is_a_400_naming_logprobs(client: openai.OpenAI) -> None:
    from worker.schedule.prompt_scoring import MAX_SCORED_PROMPT_TOKENS

    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=MODEL, prompt=[42] * (MAX_SCORED_PROMPT_TOKENS + 1), echo=True, logprobs=1,
                                  max_tokens=1)
    error = caught.value.body
    assert caught.value.status_code == 400 and error["param"] == "logprobs" and error["type"] == "invalid_request_error"
