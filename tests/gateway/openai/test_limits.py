"""Bounds on every free-text field: a 400 naming the field (OpenAI's shape; Anthropic's on /v1/messages), and the
OpenAPI document stating the very limits the validation applies (read from the same constants)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from gateway.admin.openapi import openapi_document
from gateway.http.fields import MAX_METADATA_KEY_CHARS, MAX_METADATA_PAIRS, MAX_METADATA_VALUE_CHARS
from gateway.replies import protocol
from gateway.replies.tools import MAX_CALL_TEXT_BYTES
from shared.errors import InvalidRequest
from shared.settings import Settings

SETTINGS = Settings()
USER = [{"role": "user", "content": "hi"}]
CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


def _chat(**fields: Any) -> dict[str, Any]:
    return {"model": "smollm2", "messages": USER, **fields}


def _refused_param(body: dict[str, Any]) -> str:
    with pytest.raises(InvalidRequest) as caught:
        protocol.parse_chat(body, SETTINGS)
    assert caught.value.status == 400
    return str(caught.value.param)


def _schema(name: str) -> dict[str, Any]:
    return openapi_document(SETTINGS)["components"]["schemas"][name]["properties"]


def test_the_openapi_document_states_the_limits_validation_applies() -> None:
    chat = _schema("ChatCompletionRequest")
    stop_text, stop_list, _null = chat["stop"]["anyOf"]
    assert stop_list["maxItems"] == protocol.MAX_STOP == 4
    assert stop_text["maxLength"] == protocol.MAX_STOP_BYTES // 4  # characters of up to 4 bytes each
    assert str(protocol.MAX_STOP_BYTES) in stop_text["description"]
    bias = chat["logit_bias"]["anyOf"][0]
    assert bias["maxProperties"] == protocol.MAX_LOGIT_BIAS_ENTRIES == 1024  # the document said 300 while 1024 passed
    assert bias["propertyNames"]["pattern"] == f"^[0-9]{{1,{protocol.MAX_TOKEN_ID_DIGITS}}}$"
    assert chat["user"]["anyOf"][0]["maxLength"] == protocol.MAX_USER_CHARS
    assert chat["model"]["maxLength"] == protocol.MAX_MODEL_NAME
    metadata = chat["metadata"]["anyOf"][0]
    assert metadata["maxProperties"] == MAX_METADATA_PAIRS
    assert metadata["propertyNames"]["maxLength"] == MAX_METADATA_KEY_CHARS
    assert metadata["additionalProperties"]["maxLength"] == MAX_METADATA_VALUE_CHARS
    assert _schema("CompletionRequest")["stop"] == chat["stop"]


def test_each_documented_limit_is_the_edge_of_what_validation_accepts() -> None:
    chat = _schema("ChatCompletionRequest")
    stops = chat["stop"]["anyOf"][1]["maxItems"]
    protocol.parse_chat(_chat(stop=["x"] * stops), SETTINGS)
    assert _refused_param(_chat(stop=["x"] * (stops + 1))) == "stop"
    entries = chat["logit_bias"]["anyOf"][0]["maxProperties"]
    protocol.parse_chat(_chat(logit_bias={str(i): 1 for i in range(entries)}), SETTINGS)
    assert _refused_param(_chat(logit_bias={str(i): 1 for i in range(entries + 1)})) == "logit_bias"
    protocol.parse_chat(_chat(logit_bias={"9" * protocol.MAX_TOKEN_ID_DIGITS: 1}), SETTINGS)
    assert _refused_param(_chat(logit_bias={"9" * (protocol.MAX_TOKEN_ID_DIGITS + 1): 1})) == "logit_bias"
    user = chat["user"]["anyOf"][0]["maxLength"]
    protocol.parse_chat(_chat(user="u" * user), SETTINGS)
    assert _refused_param(_chat(user="u" * (user + 1))) == "user"
    pairs = chat["metadata"]["anyOf"][0]["maxProperties"]
    protocol.parse_chat(_chat(metadata={f"k{i}": "v" for i in range(pairs)}), SETTINGS)
    assert _refused_param(_chat(metadata={f"k{i}": "v" for i in range(pairs + 1)})) == "metadata"


def test_a_stop_string_is_bounded_in_bytes_whatever_its_script() -> None:
    limit = protocol.MAX_STOP_BYTES
    protocol.parse_chat(_chat(stop="a" * limit), SETTINGS)
    protocol.parse_chat(_chat(stop=["é" * (limit // 2)]), SETTINGS)  # 2 bytes each: exactly the limit
    assert _refused_param(_chat(stop="a" * (limit + 1))) == "stop"
    assert _refused_param(_chat(stop=["ok", "é" * (limit // 2 + 1)])) == "stop"
    assert _refused_param(_chat(stop="x" * 300_000)) == "stop"  # what the outside fault run got accepted


@pytest.mark.parametrize(("body", "param"), [
    (_chat(messages=[{"role": "user", "content": "hi", "name": "n" * 257}]), "messages[0].name"),
    (_chat(messages=[{"role": "tool", "content": "x", "tool_call_id": "c" * (MAX_CALL_TEXT_BYTES + 1)}]),
     "messages[0].tool_call_id"),
    (_chat(messages=[{"role": "assistant", "tool_calls": [{**CALL, "id": "c" * (MAX_CALL_TEXT_BYTES + 1)}]}]),
     "messages[0].tool_calls[0].id"),
    (_chat(messages=[{"role": "assistant", "tool_calls": [
        {**CALL, "function": {"name": "f" * (MAX_CALL_TEXT_BYTES + 1), "arguments": "{}"}}]}]),
     "messages[0].tool_calls[0].function.name"),
    (_chat(metadata={"k" * (MAX_METADATA_KEY_CHARS + 1): "v"}), "metadata"),
    (_chat(metadata={"k": "v" * (MAX_METADATA_VALUE_CHARS + 1)}), "metadata"),
    (_chat(metadata={"k": 1}), "metadata"),
])
def test_names_ids_and_metadata_are_bounded(body: dict[str, Any], param: str) -> None:
    assert _refused_param(body) == param


def test_the_bounds_leave_ordinary_requests_alone() -> None:
    body = _chat(messages=[{"role": "user", "content": "hi", "name": "alice"},
                           {"role": "assistant", "tool_calls": [CALL]},
                           {"role": "tool", "content": "42", "tool_call_id": "call_1"}],
                 stop=["\n\n", "END"], user="u-1", metadata={"team": "docs"})
    assert protocol.parse_chat(body, SETTINGS).params.stop == ["\n\n", "END"]


# ---- over HTTP: the error's shape and field ---------------------------------------------------------------


@pytest.mark.anyio
async def test_a_huge_stop_string_is_an_openai_400_naming_stop(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/chat/completions", json=_chat(stop="x" * 300_000))
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", "stop")
    assert "1024 bytes" in error["message"]


@pytest.mark.anyio
@pytest.mark.parametrize(("extra", "field"), [
    ({"stop_sequences": ["x" * 300_000]}, "stop_sequences"),
    ({"stop_sequences": ["é" * 600]}, "stop_sequences"),  # 1,200 bytes
    ({"metadata": {"user_id": "u" * 300}}, "metadata.user_id"),
    ({"metadata": "u1"}, "metadata"),
    ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": [
        {"type": "tool_use", "id": "t" * 300, "name": "f", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "r"}]}]},
     "messages[1].content[0].id"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t" * 300}]}]},
     "messages[0].content[0].tool_use_id"),
])
async def test_anthropic_free_text_bounds_are_400s_in_anthropics_shape(
        client: httpx.AsyncClient, extra: dict[str, Any], field: str) -> None:
    body = {"model": "smollm2", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}], **extra}
    response = await client.post("/v1/messages", json=body)
    assert response.status_code == 400, response.text
    reply = response.json()
    assert reply["type"] == "error" and reply["error"]["type"] == "invalid_request_error"
    assert f"'{field}'" in reply["error"]["message"]


@pytest.mark.parametrize("value", [
    ["a"] * (SETTINGS.max_embed_inputs + 1),  # too many inputs
    ["x" * (SETTINGS.max_prompt_chars // 2 + 1)] * 2,  # too many characters in all
    [[1] * (SETTINGS.max_prompt_chars // 2 + 1)] * 2,  # too many tokens in all
    [""], [], [[1, -2]]])
def test_an_embedding_input_over_the_limits_is_a_400_naming_input(value: Any) -> None:
    from gateway.ollama.protocol import parse_embed_request

    with pytest.raises(InvalidRequest) as caught:
        protocol.parse_embeddings({"model": "e", "input": value}, SETTINGS)
    assert caught.value.status == 400 and str(caught.value.param).startswith("input"), caught.value.message
    if value and all(isinstance(v, str) for v in value):  # Ollama's /api/embed takes strings: the same bounds
        with pytest.raises(InvalidRequest) as ollama_caught:
            parse_embed_request({"model": "e", "input": value}, SETTINGS)
        assert ollama_caught.value.status == 400 and ollama_caught.value.param == "input"
