"""Request validation: what valid requests turn into (the HTTP tests cover the refusals)."""

from __future__ import annotations

import pytest

from gateway.replies import protocol, serving
from shared.errors import InvalidRequest
from shared.messages import ChatMessage
from shared.settings import Settings

SETTINGS = Settings(max_n=4, max_tokens_limit=100, max_prompt_chars=50)


def test_chat_defaults() -> None:
    request = protocol.parse_chat({"model": "m", "messages": [{"role": "user", "content": "hi"}]}, SETTINGS)
    params = request.params
    assert (params.max_tokens, params.n, params.stream, params.include_usage) == (None, 1, False, False)
    assert (params.priority, params.cache_prompt, params.ignore_eos, params.stop) == ("normal", True, False, [])
    assert (params.sampling.temperature, params.sampling.top_p, params.sampling.top_k) == (1.0, 1.0, 0)
    assert (request.logprobs, request.top_logprobs) == (False, None)


def test_chat_everything() -> None:
    body = {
        "model": "m",
        "messages": [
            {"role": "system", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": None, "name": "bot"},
            {"role": "user", "content": "q"},
        ],
        "max_tokens": 50,
        "max_completion_tokens": 7,
        "n": 2,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0,
        "top_p": 0.5,
        "top_k": -1,
        "min_p": 0.1,
        "repetition_penalty": 1.1,
        "presence_penalty": -2,
        "frequency_penalty": 2,
        "logit_bias": {"0": -100, "17": 5.5},
        "seed": -3,
        "stop": ["x", "y"],
        "logprobs": True,
        "ignore_eos": True,
        "priority": "critical",
        "cache_prompt": False,
        "user": "someone",
        "some_future_field": {"ignored": True},
    }
    request = protocol.parse_chat(body, SETTINGS)
    assert request.messages == [
        ChatMessage(role="system", content="a\nb"),
        ChatMessage(role="assistant", content="", name="bot"),
        ChatMessage(role="user", content="q"),
    ]
    params = request.params
    assert params.max_tokens == 7  # max_completion_tokens wins
    assert (params.n, params.stream, params.include_usage, params.stop) == (2, True, True, ["x", "y"])
    sampling = params.sampling
    assert (sampling.temperature, sampling.top_p, sampling.top_k, sampling.min_p) == (0.0, 0.5, 0, 0.1)
    assert (sampling.repetition_penalty, sampling.presence_penalty, sampling.frequency_penalty) == (1.1, -2.0, 2.0)
    assert (sampling.logit_bias, sampling.seed) == ({0: -100.0, 17: 5.5}, -3)
    assert (params.ignore_eos, params.priority, params.cache_prompt) == (True, "critical", False)
    job = serving.build_jobs(request, Settings(request_timeout_s=30), "req-x", 1000.0)[0]
    assert (job.logprobs, job.deadline, job.sampling.seed, job.stream) == (0, 1030.0, -3, True)


def test_completion_prompt_forms_and_defaults() -> None:
    parse = protocol.parse_completion
    assert parse({"model": "m", "prompt": "p"}, SETTINGS).prompts == ["p"]
    assert parse({"model": "m", "prompt": ""}, SETTINGS).prompts == [""]
    assert parse({"model": "m", "prompt": ["a", "b"]}, SETTINGS).prompts == ["a", "b"]
    assert parse({"model": "m", "prompt": [1, 2]}, SETTINGS).prompts == [[1, 2]]
    assert parse({"model": "m", "prompt": [[1], [2, 3]]}, SETTINGS).prompts == [[1], [2, 3]]
    request = parse({"model": "m", "prompt": "p", "max_tokens": 0, "echo": True, "logprobs": 0}, SETTINGS)
    assert (request.params.max_tokens, request.echo, request.logprobs) == (0, True, 0)
    assert parse({"model": "m", "prompt": "p"}, SETTINGS).params.max_tokens == 16
    jobs = serving.build_jobs(parse({"model": "m", "prompt": [[1], [2]]}, SETTINGS), SETTINGS, "req-y", 0.0)
    assert [j.id for j in jobs] == ["req-y-0", "req-y-1"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "m", "prompt": ["a"] * 3, "n": 2}, "n"),  # 6 choices > max_n 4
        ({"model": "m", "prompt": "x" * 51}, "prompt"),
        ({"model": "m", "prompt": "p", "max_tokens": 101}, "max_tokens"),
        ({"model": " ", "prompt": "p"}, "model"),
    ],
)
def test_completion_limits(body: dict[str, object], param: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        protocol.parse_completion(body, SETTINGS)
    assert refused.value.param == param


def test_chat_prompt_size_limit() -> None:
    with pytest.raises(InvalidRequest) as refused:
        protocol.parse_chat({"model": "m", "messages": [{"role": "user", "content": "x" * 51}]}, SETTINGS)
    assert refused.value.param == "messages"


def test_embedding_inputs() -> None:
    parse = protocol.parse_embeddings
    assert parse({"model": "e", "input": "a"}, SETTINGS).inputs == ["a"]
    assert parse({"model": "e", "input": [[1, 2]], "encoding_format": "base64"}, SETTINGS).encoding_format == "base64"
    with pytest.raises(InvalidRequest):
        parse({"model": "e", "input": [True]}, SETTINGS)
