"""The gateway's OpenAPI 3.1 document (GET /openapi.json), with this gateway's configured limits in its schemas.

It describes what the gateway accepts: a body valid under these schemas is not refused for its shape (it may
still be refused for a rule between fields, e.g. top_logprobs without logprobs, with a 400 in OpenAI's shape).
The OpenAI routes are also served without the /v1 prefix; the document lists the /v1 ones. The Anthropic,
Ollama and admin routes are listed too (gateway/admin/openapi_other_apis.py), each with its API's error shape;
not listed: this document, the dashboard (HTML) and /metrics (Prometheus' text format).
"""

from __future__ import annotations

from typing import Any

from gateway.admin.openapi_other_apis import other_api_paths, other_api_schemas, page_parameters
from gateway.admin.openapi_parts import JSON, Schema, nullable, object_schema, operation, resume_operation
from gateway.http.fields import MAX_METADATA_KEY_CHARS, MAX_METADATA_PAIRS, MAX_METADATA_VALUE_CHARS
from gateway.replies.protocol import (
    LOGIT_BIAS_RANGE,
    MAX_LOGIT_BIAS_ENTRIES,
    MAX_MODEL_NAME,
    MAX_NAME_BYTES,
    MAX_STOP,
    MAX_STOP_BYTES,
    MAX_TOKEN_ID_DIGITS,
    MAX_USER_CHARS,
    MIN_P_RANGE,
    PENALTY_RANGE,
    REPETITION_PENALTY_RANGE,
    TEMPERATURE_RANGE,
    TOP_P_RANGE,
)
from shared.messages import PRIORITIES_LOW_TO_HIGH
from shared.settings import Settings


def _token_ids(limit: int, *, min_items: int = 1) -> Schema:
    return {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 2**31 - 1},
            "minItems": min_items, "maxItems": limit}


def _text(max_bytes: int, *, min_length: int = 0) -> Schema:
    """A string the gateway bounds in UTF-8 bytes: JSON Schema counts characters (up to 4 bytes each), so the
    schema's maxLength is what any script fits in, and the description states the byte bound."""
    return {"type": "string", "minLength": min_length, "maxLength": max_bytes // 4,
            "description": f"at most {max_bytes} bytes in UTF-8"}


def _range(bounds: tuple[float, float], *, lo_open: bool = False) -> Schema:
    """A number in [lo, hi] (or (lo, hi]), from the protocol's constant."""
    low, high = bounds
    return nullable({"type": "number", "exclusiveMinimum" if lo_open else "minimum": low, "maximum": high})


def _sampling(settings: Settings) -> dict[str, Schema]:
    """The fields chat and text completions share."""
    stop_text = _text(MAX_STOP_BYTES, min_length=1)
    stop = {"anyOf": [stop_text, {"type": "array", "maxItems": MAX_STOP, "items": stop_text}, {"type": "null"}]}
    return {
        "model": {"type": "string", "minLength": 1, "maxLength": MAX_MODEL_NAME, "pattern": r"\S",
                  "description": "optional when exactly one model is served"},
        "n": nullable({"type": "integer", "minimum": 1, "maximum": settings.max_n}),
        "stream": nullable({"type": "boolean"}),
        "stream_options": nullable(object_schema({"include_usage": nullable({"type": "boolean"})})),
        "temperature": _range(TEMPERATURE_RANGE),
        "top_p": _range(TOP_P_RANGE, lo_open=True),
        "top_k": nullable({"type": "integer", "minimum": 0, "maximum": 1000}),
        "min_p": _range(MIN_P_RANGE),
        "presence_penalty": _range(PENALTY_RANGE),
        "frequency_penalty": _range(PENALTY_RANGE),
        "repetition_penalty": _range(REPETITION_PENALTY_RANGE),
        "seed": nullable({"type": "integer", "minimum": -(2**63), "maximum": 2**63 - 1}),
        "stop": stop,
        "logit_bias": nullable({"type": "object", "additionalProperties": {"type": "number",
                                                                            "minimum": LOGIT_BIAS_RANGE[0],
                                                                            "maximum": LOGIT_BIAS_RANGE[1]},
                                 "propertyNames": {"pattern": f"^[0-9]{{1,{MAX_TOKEN_ID_DIGITS}}}$"},
                                 "maxProperties": MAX_LOGIT_BIAS_ENTRIES}),
        "user": nullable({"type": "string", "maxLength": MAX_USER_CHARS}),
        "metadata": nullable({"type": "object", "maxProperties": MAX_METADATA_PAIRS,
                               "propertyNames": {"maxLength": MAX_METADATA_KEY_CHARS},
                               "additionalProperties": {"type": "string", "maxLength": MAX_METADATA_VALUE_CHARS}}),
        "ignore_eos": nullable({"type": "boolean"}),
        "cache_prompt": nullable({"type": "boolean"}),
        "priority": nullable({"enum": list(PRIORITIES_LOW_TO_HIGH)}),
        "timings_per_token": nullable({"type": "boolean", "description": "add llama-server's `timings`"}),
    }


def _request_schemas(settings: Settings) -> dict[str, Schema]:
    """The request bodies of the OpenAI and llama-server routes."""
    chat = _chat_request(settings)
    model = {"model": _sampling(settings)["model"]}
    return {
        "ChatCompletionRequest": chat,
        "ResponsesRequest": _responses_request(settings),
        "CompletionRequest": _completion_request(settings),
        "EmbeddingRequest": _embedding_request(settings),
        "TokenizeRequest": object_schema({**model, "content": {"type": "string", "maxLength": 10_000},
                                    "add_special": {"type": "boolean"}, "parse_special": {"type": "boolean"},
                                    "with_pieces": {"type": "boolean"}}, ("content",)),
        "DetokenizeRequest": object_schema({**model, "tokens": _token_ids(256, min_items=0)}, ("tokens",)),
        "ApplyTemplateRequest": object_schema({**model, "messages": chat["properties"]["messages"],
                                         "add_generation_prompt": {"type": "boolean"}}, ("messages",)),
    }


def _chat_request(settings: Settings) -> Schema:
    """A chat completion's body."""
    limit = settings.max_tokens_limit
    text_part = object_schema({"type": {"const": "text"}, "text": {"type": "string", "maxLength": 10_000}}, ("type", "text"))
    content = {"anyOf": [{"type": "string", "maxLength": 10_000},
                         {"type": "array", "items": text_part, "maxItems": 8}]}
    message = {"oneOf": [
        object_schema({"role": {"enum": ["system", "developer", "user"]}, "content": content, "name":
                 _text(MAX_NAME_BYTES)}, ("role", "content")),
        object_schema({"role": {"const": "assistant"}, "content": nullable(content)}, ("role",)),
    ]}
    return object_schema({**_sampling(settings),
                    "messages": {"type": "array", "items": message, "minItems": 1, "maxItems": 16},
                    "max_tokens": nullable({"type": "integer", "minimum": 1, "maximum": limit}),
                    "max_completion_tokens": nullable({"type": "integer", "minimum": 1, "maximum": limit}),
                    "logprobs": nullable({"type": "boolean"})}, ("messages",))


def _completion_request(settings: Settings) -> Schema:
    """A text completion's body."""
    prompt = {"anyOf": [{"type": "string", "maxLength": 10_000},
                        {"type": "array", "items": {"type": "string", "maxLength": 10_000}, "minItems": 1,
                         "maxItems": 1},
                        _token_ids(256)]}
    return object_schema({**_sampling(settings), "prompt": prompt,
                          "max_tokens": nullable({"type": "integer", "minimum": 0, "maximum": settings.max_tokens_limit}),
                          "echo": nullable({"type": "boolean"}),
                          "logprobs": nullable({"type": "integer", "minimum": 0, "maximum": 5})}, ("prompt",))


def _embedding_request(settings: Settings) -> Schema:
    """An embeddings request's body."""
    embed_input = {"anyOf": [{"type": "string", "minLength": 1, "maxLength": 10_000},
                             {"type": "array", "items": {"type": "string", "minLength": 1, "maxLength": 2_000},
                              "minItems": 1, "maxItems": 16},
                             _token_ids(256)]}
    return object_schema({"model": _sampling(settings)["model"], "input": embed_input,
                          "encoding_format": nullable({"enum": ["float", "base64"]})}, ("input",))


def _responses_request(settings: Settings) -> Schema:
    """The Responses API's body (gateway/responses_api/protocol.py): text input items, no tools."""
    text = {"type": "string", "maxLength": 10_000}
    part = object_schema({"type": {"enum": ["input_text", "output_text"]}, "text": text}, ("type", "text"))
    message = object_schema({"type": {"const": "message"}, "role": {"enum": ["system", "developer", "user", "assistant"]},
                       "content": {"anyOf": [text, {"type": "array", "items": part, "maxItems": 8}]}},
                      ("role", "content"))
    call_id = {"type": "string", "minLength": 1, "maxLength": 64}
    call = object_schema({"type": {"const": "function_call"}, "call_id": call_id, "arguments": {"const": "{}"},
                    "name": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"}},
                   ("type", "call_id", "name", "arguments"))
    output = object_schema({"type": {"const": "function_call_output"}, "call_id": call_id, "output": text},
                     ("type", "call_id", "output"))
    items = {"type": "array", "items": {"oneOf": [message, call, output]}, "minItems": 1, "maxItems": 8}
    sampling = _sampling(settings)
    fields = ("model", "temperature", "top_p", "top_k", "seed", "presence_penalty", "frequency_penalty", "priority")
    fmt = object_schema({"format": object_schema({"type": {"enum": ["text", "json_object"]}}, ("type",))})
    return object_schema({**{name: sampling[name] for name in fields}, "input": {"anyOf": [text, items]},
                    "instructions": nullable(text),
                    "max_output_tokens": nullable({"type": "integer", "minimum": 1,
                                                    "maximum": settings.max_tokens_limit}),
                    "metadata": nullable({"type": "object", "maxProperties": 16,
                                           "additionalProperties": {"type": "string", "maxLength": 512},
                                           "propertyNames": {"maxLength": 64}}),
                    "store": nullable({"type": "boolean"}), "stream": nullable({"type": "boolean"}),
                    "text": nullable(fmt),
                    "previous_response_id": nullable({"type": "string", "pattern": "^resp_[A-Za-z0-9]{1,64}$"})},
                   ("input",))


def _completion_bodies() -> dict[str, Schema]:
    """A chat completion's and a text completion's reply."""
    usage = object_schema({"prompt_tokens": {"type": "integer"}, "completion_tokens": {"type": "integer"},
                     "total_tokens": {"type": "integer"}}, ("prompt_tokens", "total_tokens"))
    finish = nullable({"enum": ["stop", "length", "tool_calls", "cancelled"]})
    chat_choice = object_schema({"index": {"type": "integer"}, "finish_reason": finish,
                           "message": object_schema({"role": {"const": "assistant"}, "content": nullable({"type": "string"})},
                                              ("role",))}, ("index", "message", "finish_reason"))
    text_choice = object_schema({"index": {"type": "integer"}, "text": {"type": "string"}, "finish_reason": finish},
                          ("index", "text", "finish_reason"))
    return {
        "ChatCompletion": object_schema({"id": {"type": "string"}, "object": {"const": "chat.completion"},
                                   "model": {"type": "string"}, "choices": {"type": "array", "items": chat_choice},
                                   "usage": usage}, ("id", "object", "model", "choices", "usage")),
        "Completion": object_schema({"id": {"type": "string"}, "object": {"const": "text_completion"},
                               "model": {"type": "string"}, "choices": {"type": "array", "items": text_choice},
                               "usage": usage}, ("id", "object", "model", "choices", "usage")),
    }


def _response_schemas() -> dict[str, Schema]:
    """The reply bodies of the OpenAI and llama-server routes."""
    model = object_schema({"id": {"type": "string"}, "object": {"const": "model"}, "created": {"type": "integer"},
                     "owned_by": {"type": "string"}}, ("id", "object", "created", "owned_by"))
    piece = object_schema({"id": {"type": "integer"}, "piece": {"anyOf": [{"type": "string"},
                                                                     {"type": "array", "items": {"type": "integer"}}]}},
                    ("id", "piece"))
    return {
        "Error": object_schema({"error": object_schema({"message": {"type": "string"}, "type": {"type": "string"},
                                            "param": nullable({"type": "string"}),
                                            "code": nullable({"type": "string"})},
                                           ("message", "type", "param", "code"))}, ("error",)),
        **_completion_bodies(),
        "EmbeddingList": object_schema({"object": {"const": "list"}, "model": {"type": "string"},
                                  "data": {"type": "array", "items": object_schema(
                                      {"object": {"const": "embedding"}, "index": {"type": "integer"},
                                       "embedding": {"anyOf": [{"type": "string"},
                                                               {"type": "array", "items": {"type": "number"}}]}},
                                      ("object", "index", "embedding"))}}, ("object", "data", "model")),
        "Response": object_schema({"id": {"type": "string"}, "object": {"const": "response"},
                             "status": {"enum": ["completed", "incomplete", "cancelled", "failed", "in_progress"]},
                             "output": {"type": "array", "items": {"type": "object"}},
                             "usage": nullable({"type": "object"})}, ("id", "object", "status", "output")),
        "Model": model,
        "ModelList": object_schema({"object": {"const": "list"}, "data": {"type": "array", "items": model}},
                             ("object", "data")),
        "Tokens": object_schema({"tokens": {"anyOf": [{"type": "array", "items": {"type": "integer"}},
                                                {"type": "array", "items": piece}]}}, ("tokens",)),
        "Detokenized": object_schema({"content": {"type": "string"}}, ("content",)),
        "Rendered": object_schema({"prompt": {"type": "string"}}, ("prompt",)),
    }


def _health_paths() -> dict[str, Any]:
    """Liveness and readiness."""
    plain = {"200": {"description": "success", "content": {JSON: {"schema": {"type": "object"}}}},
             "503": {"description": "not ready", "content": {JSON: {"schema": {"type": "object"}}}}}
    return {
        "/health": {"get": {"summary": "The process is up (liveness)", "tags": ["health"],
                            "responses": {"200": plain["200"]}}},
        "/ready": {"get": {"summary": "Every model the deployment was started with can take a request",
                           "tags": ["health"], "responses": plain}},
        "/ready/gateway": {"get": {"summary": "This gateway can take and queue requests (Redis answers)",
                                   "tags": ["health"], "responses": plain}},
    }


def openapi_document(settings: Settings) -> dict[str, Any]:
    """The OpenAPI 3.1 document of this gateway's API."""
    rid = ("response_id",)
    listing = operation("The input items a stored response read (a cursor page)", None, "ItemList", params=rid)
    listing["parameters"] += page_parameters()
    paths = {
        "/v1/chat/completions": {"post": operation("Chat completion", "ChatCompletionRequest", "ChatCompletion",
                                                   stream=True)},
        "/v1/chat/completions/{stream_id}/stream": {"get": resume_operation("Resume a chat completion stream")},
        "/v1/completions": {"post": operation("Text completion", "CompletionRequest", "Completion", stream=True)},
        "/v1/completions/{stream_id}/stream": {"get": resume_operation("Resume a completion stream")},
        "/v1/responses": {"post": operation("Create a response (Responses API)", "ResponsesRequest", "Response",
                                            stream=True)},
        "/v1/responses/{response_id}": {"get": operation("A stored response (?stream=true&starting_after=N: its "
                                                         "events again)", None, "Response", params=rid, stream=True),
                                        "delete": operation("Delete a stored response", None, "Deleted",
                                                            params=rid)},
        "/v1/responses/{response_id}/input_items": {"get": listing},
        "/v1/responses/{response_id}/cancel": {"post": operation("Cancel a running response", None, "Response",
                                                                 params=rid)},
        "/v1/embeddings": {"post": operation("Embeddings", "EmbeddingRequest", "EmbeddingList")},
        "/v1/models": {"get": operation("Models with a live worker", None, "ModelList")},
        "/v1/models/{model}": {"get": operation("One model", None, "Model", params=("model",))},
        "/tokenize": {"post": operation("Tokenize (llama-server)", "TokenizeRequest", "Tokens", tag="llama-server")},
        "/detokenize": {"post": operation("Detokenize (llama-server)", "DetokenizeRequest", "Detokenized",
                                          tag="llama-server")},
        "/apply-template": {"post": operation("Render the chat template (llama-server)", "ApplyTemplateRequest",
                                              "Rendered", tag="llama-server")},
        **_health_paths(),
        **other_api_paths(),
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "llmfleet gateway", "version": "1", "description": __doc__.splitlines()[0]},
        "paths": paths,
        "components": {"schemas": {**_request_schemas(settings), **_response_schemas(), **other_api_schemas()},
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    }
