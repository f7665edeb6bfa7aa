"""One error root; every error maps to (HTTP status, OpenAI error type, code).

| class                  | status | type                  | code                    | Retry-After |
|------------------------|--------|-----------------------|-------------------------|-------------|
| InvalidRequest         | 400    | invalid_request_error | None                    |             |
| ContextLengthExceeded  | 400    | invalid_request_error | context_length_exceeded |             |
| NoChatTemplate         | 400    | invalid_request_error | no_chat_template        |             |
| LoraLoadFailed         | 400    | invalid_request_error | lora_load_failed        |             |
| AuthenticationFailed   | 401    | authentication_error  | invalid_api_key         |             |
| ModelNotFound          | 404    | invalid_request_error | model_not_found         |             |
| LoraNotFound           | 404    | invalid_request_error | lora_not_found          |             |
| NotFound               | 404    | invalid_request_error | None                    |             |
| ResponseNotFound       | 404    | invalid_request_error | response_not_found      |             |
| PreviousResponseNotFound | 404  | invalid_request_error | previous_response_not_found |       |
| StreamNotFound         | 404    | invalid_request_error | stream_not_found        |             |
| MethodNotAllowed       | 405    | invalid_request_error | None                    |             |
| ModelBusy              | 409    | invalid_request_error | model_busy              |             |
| LoraLimitReached       | 409    | invalid_request_error | lora_limit_reached      |             |
| BodyTooLarge           | 413    | invalid_request_error | None                    |             |
| QueueFull              | 429    | rate_limit_error      | rate_limit_exceeded     | yes         |
| RateLimited            | 429    | rate_limit_error      | rate_limit_exceeded     | yes         |
| InternalError          | 500    | server_error          | None                    |             |
| DeadLettered           | 500    | server_error          | dead_lettered           |             |
| PullFailed             | 502    | server_error          | pull_failed             |             |
| NoWorkerAvailable      | 503    | server_error          | no_worker_available     | yes         |
| ModelLoadFailed        | 503    | server_error          | model_load_failed       | yes         |
| Unavailable            | 503    | server_error          | unavailable             | yes         |
| DeadlineExceeded       | 504    | server_error          | deadline_exceeded       |             |

NotFound is a URL no route serves. DeadlineExceeded is a 504: the request was valid and accepted but no answer came in time (like a
gateway timeout), which is neither the client's fault (4xx) nor a crash (500). PullFailed is a 502: a model's
download (Ollama's /api/pull) failed upstream (the package index, its verification, or the cache).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from shared.messages import ErrorEvent


class LLMFleetError(Exception):
    """Root of every error llmfleet reports to a client."""

    http_status: ClassVar[int] = 500
    error_type: ClassVar[str] = "server_error"
    error_code: ClassVar[str | None] = None

    def __init__(self, message: str, *, param: str | None = None, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.retry_after = retry_after
        self.status = self.http_status
        self.type = self.error_type
        self.code = self.error_code

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI error body: {"error": {"message", "type", "param", "code"}}."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def headers(self) -> dict[str, str]:
        """HTTP headers that go with the error (Retry-After in whole seconds when set)."""
        if self.retry_after is None:
            return {}
        return {"Retry-After": str(max(1, math.ceil(self.retry_after)))}

    def to_event(self, request_id: str, seq: int) -> ErrorEvent:
        """The terminal ErrorEvent a worker publishes for this error."""
        return ErrorEvent(
            id=request_id,
            seq=seq,
            status=self.status,
            type=self.type,
            code=self.code,
            param=self.param,
            message=self.message,
            retry_after=self.retry_after,
        )

    @staticmethod
    def from_event(event: ErrorEvent) -> LLMFleetError:
        """Rebuild the error a worker reported; unknown (status, code) pairs keep the event's values."""
        cls = _BY_STATUS_CODE.get((event.status, event.code))
        if cls is None:
            error = LLMFleetError(event.message, param=event.param, retry_after=event.retry_after)
            error.status, error.type, error.code = event.status, event.type, event.code
            return error
        return cls(event.message, param=event.param, retry_after=event.retry_after)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, status={self.status}, code={self.code!r})"


class InvalidRequest(LLMFleetError):
    """Malformed JSON, a wrong type or an out-of-range value; `param` names the field."""

    http_status = 400
    error_type = "invalid_request_error"


class ContextLengthExceeded(InvalidRequest):
    """The prompt plus max_tokens do not fit in the model's context."""

    error_code = "context_length_exceeded"


class NoChatTemplate(InvalidRequest):
    """Chat completion asked of a model without a chat template (a base model with none configured)."""

    error_code = "no_chat_template"


class AuthenticationFailed(LLMFleetError):
    """Missing or wrong API key."""

    http_status = 401
    error_type = "authentication_error"
    error_code = "invalid_api_key"


class ModelNotFound(LLMFleetError):
    """No worker has ever served this model (recently)."""

    http_status = 404
    error_type = "invalid_request_error"
    error_code = "model_not_found"


class LoraNotFound(ModelNotFound):
    """A request named a LoRA adapter no worker of its model has loaded."""

    error_code = "lora_not_found"


class LoraLoadFailed(InvalidRequest):
    """A LoRA adapter could not be loaded (bad file, shapes that do not match the model, over a bound)."""

    error_code = "lora_load_failed"


class LoraLimitReached(LLMFleetError):
    """The model already holds LLMFLEET_MAX_LORAS adapters."""

    http_status = 409
    error_type = "invalid_request_error"
    error_code = "lora_limit_reached"


class NotFound(LLMFleetError):
    """No such URL."""

    http_status = 404
    error_type = "invalid_request_error"


class ResponseNotFound(NotFound):
    """No stored Responses API response has this id (never stored, expired, deleted, or lost with Redis)."""

    error_code = "response_not_found"


class PreviousResponseNotFound(ResponseNotFound):
    """A request's previous_response_id names no stored response."""

    error_code = "previous_response_not_found"


class StreamNotFound(NotFound):
    """A stream to resume is not known (never made, ended longer ago than the retention, or Redis lost it)."""

    error_code = "stream_not_found"


class MethodNotAllowed(LLMFleetError):
    """The URL exists but not with this HTTP method."""

    http_status = 405
    error_type = "invalid_request_error"


class ModelBusy(LLMFleetError):
    """An unload asked for a model whose workers still have requests in flight or queued (force drains them)."""

    http_status = 409
    error_type = "invalid_request_error"
    error_code = "model_busy"


class BodyTooLarge(LLMFleetError):
    """The request body is over the configured limit."""

    http_status = 413
    error_type = "invalid_request_error"


class QueueFull(LLMFleetError):
    """The model's queue is at its limit; retry after `retry_after` seconds."""

    http_status = 429
    error_type = "rate_limit_error"
    error_code = "rate_limit_exceeded"


class RateLimited(QueueFull):
    """An API key is over its requests- or tokens-per-minute limit (same status and code as OpenAI's)."""


class InternalError(LLMFleetError):
    """A bug or a broken invariant; the message says what, never the prompt."""

    http_status = 500
    error_type = "server_error"


class DeadLettered(InternalError):
    """A poison job: taken over too often without ever finishing, set aside in the dead-letter stream."""

    error_code = "dead_lettered"


class PullFailed(LLMFleetError):
    """A model could not be pulled (download, sha256 check or the model cache failed); the message says why."""

    http_status = 502
    error_type = "server_error"
    error_code = "pull_failed"


class NoWorkerAvailable(LLMFleetError):
    """The model is known but no worker serving it is alive right now."""

    http_status = 503
    error_type = "server_error"
    error_code = "no_worker_available"


class ModelLoadFailed(LLMFleetError):
    """A catalogued model could not be loaded; the failure is remembered for a while (no load storm)."""

    http_status = 503
    error_type = "server_error"
    error_code = "model_load_failed"


class Unavailable(LLMFleetError):
    """A dependency (Redis) cannot be reached."""

    http_status = 503
    error_type = "server_error"
    error_code = "unavailable"


class DeadlineExceeded(LLMFleetError):
    """The request's deadline passed before it finished."""

    http_status = 504
    error_type = "server_error"
    error_code = "deadline_exceeded"


_BY_STATUS_CODE: dict[tuple[int, str | None], type[LLMFleetError]] = {
    (cls.http_status, cls.error_code): cls
    for cls in (
        InvalidRequest,
        ContextLengthExceeded,
        NoChatTemplate,
        AuthenticationFailed,
        ModelNotFound,
        LoraNotFound,
        LoraLoadFailed,
        LoraLimitReached,
        BodyTooLarge,
        ModelBusy,
        QueueFull,
        InternalError,
        DeadLettered,
        NoWorkerAvailable,
        ModelLoadFailed,
        Unavailable,
        DeadlineExceeded,
    )
}
