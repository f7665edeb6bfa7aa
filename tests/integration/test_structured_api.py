"""Structured output end to end with the unmodified openai client: gateway -> Redis -> SmolLM2 workers."""

from __future__ import annotations

import json
from typing import Any, Literal

import openai
import pytest
from pydantic import BaseModel, Field

pytestmark = [pytest.mark.slow, pytest.mark.integration]
MODEL = "smollm2-135m"


class City(BaseModel):
    name: str = Field(max_length=30)
    country: str = Field(max_length=30)
    population_millions: float
    kind: Literal["capital", "other"]


@pytest.fixture()
def client(cluster: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=cluster.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_parse_round_trips_a_pydantic_model(client: openai.OpenAI) -> None:
    completion = client.chat.completions.parse(
        model=MODEL, messages=[{"role": "user", "content": "Describe Paris as JSON."}], response_format=City,
        max_tokens=120, temperature=0)
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(choice.message.parsed, City)
    assert choice.message.parsed == City.model_validate_json(choice.message.content)


def test_json_object_streams_one_json_object(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Give me a JSON object about cats."}], stream=True,
        response_format={"type": "json_object"}, max_tokens=200, temperature=0.7, seed=4)
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert isinstance(json.loads(text), dict)


def test_a_regex_and_a_grammar_on_completions(client: openai.OpenAI) -> None:
    reply = client.completions.create(model=MODEL, prompt="The year the Berlin wall fell:", max_tokens=10,
                                      extra_body={"regex": " [12][0-9]{3}"}, temperature=0)
    assert reply.choices[0].finish_reason == "stop" and reply.choices[0].text[1:].isdigit()
    reply = client.completions.create(model=MODEL, prompt="Is the sky blue? Answer:", max_tokens=10, n=3, seed=1,
                                      extra_body={"grammar": 'root ::= " " ("yes" | "no")'})
    assert {c.text for c in reply.choices} <= {" yes", " no"}


def test_a_bad_schema_is_a_400_naming_the_field(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=5,
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "array",
                                                                                           "uniqueItems": True}}})
    error = caught.value.body
    assert caught.value.status_code == 400
    assert error["param"] == "response_format.json_schema.schema" and "uniqueItems" in error["message"]


def test_a_schema_not_done_within_max_tokens_ends_with_length(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Describe Paris as JSON."}], max_tokens=3,
        response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": City.model_json_schema()}})
    assert reply.choices[0].finish_reason == "length" and reply.choices[0].message.content.startswith("{")
