"""The OpenAPI document's entries beyond OpenAI's generation routes: the batch API (files, batches), the
Responses API's cursor pages, Anthropic's Messages, Ollama's API and the admin routes, each with its API's error
shape. The bodies are described loosely (an object with its required fields): their rules are in each API's
protocol module."""

from __future__ import annotations

from typing import Any

from gateway.admin.openapi_parts import Schema, object_schema, operation, resume_operation
from gateway.responses_api.items import MAX_LIMIT

ANY_OBJECT: Schema = {"type": "object"}


def page_parameters() -> list[Schema]:
    """The query parameters of a cursor page (GET /v1/responses/{id}/input_items)."""
    return [{"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT}},
            {"name": "order", "in": "query", "schema": {"enum": ["asc", "desc"]}},
            {"name": "after", "in": "query", "schema": {"type": "string"}},
            {"name": "before", "in": "query", "schema": {"type": "string"}}]


def _batch_paths() -> dict[str, Any]:
    upload = {"multipart/form-data": {"schema": object_schema({"file": {"type": "string", "format": "binary"},
                                                         "purpose": {"const": "batch"}}, ("file", "purpose"))}}
    file_id, batch_id = ("file_id",), ("batch_id",)
    return {
        "/v1/files": {"post": {**operation("Upload a batch input file (JSONL)", None, "Object", tag="openai-batch"),
                               "requestBody": {"required": True, "content": upload}},
                      "get": operation("Files", None, "Object", tag="openai-batch")},
        "/v1/files/{file_id}": {"get": operation("One file", None, "Object", tag="openai-batch", params=file_id),
                                "delete": operation("Delete a file", None, "Object", tag="openai-batch",
                                                    params=file_id)},
        "/v1/files/{file_id}/content": {"get": operation("A file's content (JSONL)", None, "Object",
                                                         tag="openai-batch", params=file_id)},
        "/v1/batches": {"post": operation("Create a batch", "BatchRequest", "Object", tag="openai-batch"),
                        "get": operation("Batches, newest first", None, "Object", tag="openai-batch")},
        "/v1/batches/{batch_id}": {"get": operation("One batch", None, "Object", tag="openai-batch",
                                                    params=batch_id)},
        "/v1/batches/{batch_id}/cancel": {"post": operation("Cancel a batch", None, "Object", tag="openai-batch",
                                                            params=batch_id)},
    }


def _anthropic_paths() -> dict[str, Any]:
    def messages(summary: str, reply: str, *, stream: bool = False) -> Schema:
        return operation(summary, "AnthropicMessagesRequest", reply, stream=stream, tag="anthropic",
                         error="AnthropicError")
    return {"/v1/messages": {"post": messages("Create a message (Anthropic's Messages API)", "Object",
                                              stream=True)},
            "/v1/messages/count_tokens": {"post": messages("Count a message's prompt tokens", "Object")},
            "/v1/messages/{message_id}/stream": {"get": resume_operation("Resume a message stream", "message_id",
                                                                         "anthropic", "AnthropicError")}}


def _ollama_paths() -> dict[str, Any]:
    def ollama(summary: str, body: str | None, *, stream: bool = False) -> Schema:
        found = operation(summary, body, "Object", tag="ollama", error="OllamaError")
        if stream:  # NDJSON unless "stream": false
            found["responses"]["200"]["content"]["application/x-ndjson"] = {"schema": ANY_OBJECT}
        return found
    return {
        "/api/chat": {"post": ollama("Chat (Ollama)", "OllamaChatRequest", stream=True)},
        "/api/generate": {"post": ollama("Generate (Ollama)", "OllamaGenerateRequest", stream=True)},
        "/api/embed": {"post": ollama("Embed (Ollama)", "OllamaEmbedRequest")},
        "/api/embeddings": {"post": ollama("Embed one prompt (Ollama's older route)", "OllamaEmbeddingsRequest")},
        "/api/tags": {"get": ollama("Local models (Ollama)", None)},
        "/api/ps": {"get": ollama("Loaded models (Ollama)", None)},
        "/api/show": {"post": ollama("One model's details (Ollama)", "OllamaModelRequest")},
        "/api/pull": {"post": ollama("Pull a model llmfleet knows, with progress objects (Ollama)",
                                     "OllamaPullRequest", stream=True)},
        "/api/version": {"get": ollama("The Ollama API version", None)},
    }


def _admin_paths() -> dict[str, Any]:
    def admin(summary: str, body: str | None = None, params: tuple[str, ...] = ()) -> Schema:
        return operation(summary, body, "Object", tag="admin", params=params)
    return {
        "/admin/models": {"get": admin("Warm pool: every catalogued or served model and its status")},
        "/admin/models/load": {"post": admin("Warm pool: load a replica of a model", "AdminModelRequest")},
        "/admin/models/unload": {"post": admin("Warm pool: unload a model", "AdminModelRequest")},
        "/admin/kv-tier/drop": {"post": admin("Empty every host's KV tier of a model", "AdminModelRequest")},
        "/admin/loras": {"post": admin("Load a LoRA adapter on every worker of a model", "AdminLoraRequest"),
                         "get": admin("LoRA adapters per model")},
        "/admin/loras/{model}/{name}": {"delete": admin("Unload a LoRA adapter", params=("model", "name"))},
    }


def other_api_paths() -> dict[str, Any]:
    """The document's paths beyond OpenAI's generation routes."""
    return {**_batch_paths(), **_anthropic_paths(), **_ollama_paths(), **_admin_paths()}


def other_api_schemas() -> dict[str, Schema]:
    """The components those paths name."""
    text, model = {"type": "string"}, {"type": "string", "minLength": 1}
    item = object_schema({"id": text, "type": text}, ("id", "type"))
    return {
        "Object": ANY_OBJECT,
        "Deleted": object_schema({"id": text, "object": text, "deleted": {"type": "boolean"}}, ("id", "object", "deleted")),
        "ItemList": object_schema({"object": {"const": "list"}, "data": {"type": "array", "items": item},
                             "first_id": {"type": ["string", "null"]}, "last_id": {"type": ["string", "null"]},
                             "has_more": {"type": "boolean"}}, ("object", "data", "has_more")),
        "BatchRequest": object_schema({"input_file_id": text, "endpoint": text, "completion_window": text,
                                 "metadata": ANY_OBJECT}, ("input_file_id", "endpoint", "completion_window")),
        "AnthropicMessagesRequest": object_schema({"model": model, "messages": {"type": "array"},
                                             "max_tokens": {"type": "integer", "minimum": 1}},
                                            ("model", "messages")),
        "AnthropicError": object_schema({"type": {"const": "error"}, "error": object_schema(
            {"type": text, "message": text}, ("type", "message"))}, ("type", "error")),
        "OllamaChatRequest": object_schema({"model": model, "messages": {"type": "array"}, "stream": {"type": "boolean"},
                                      "think": {"type": ["boolean", "string"]}, "options": ANY_OBJECT,
                                      "format": {"type": ["string", "object"]}, "tools": {"type": "array"},
                                      "keep_alive": {"type": ["string", "number"]}}, ("model",)),
        "OllamaGenerateRequest": object_schema({"model": model, "prompt": text, "system": text, "raw": {"type": "boolean"},
                                          "stream": {"type": "boolean"}, "think": {"type": ["boolean", "string"]},
                                          "options": ANY_OBJECT, "format": {"type": ["string", "object"]},
                                          "keep_alive": {"type": ["string", "number"]}}, ("model",)),
        "OllamaEmbedRequest": object_schema({"model": model, "input": {"type": ["string", "array"]},
                                       "truncate": {"type": "boolean"}}, ("model", "input")),
        "OllamaEmbeddingsRequest": object_schema({"model": model, "prompt": text}, ("model", "prompt")),
        "OllamaModelRequest": object_schema({"model": model}, ("model",)),
        "OllamaPullRequest": object_schema({"model": model, "stream": {"type": "boolean"},
                                            "insecure": {"type": "boolean"}}, ("model",)),
        "OllamaError": object_schema({"error": text}, ("error",)),
        "AdminModelRequest": object_schema({"model": model, "wait": {"type": "boolean"}, "timeout": {"type": "number"},
                                      "force": {"type": "boolean"}}, ("model",)),
        "AdminLoraRequest": object_schema({"model": model, "name": text, "path": text}, ("model", "name")),
    }

