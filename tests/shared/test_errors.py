"""Errors map to OpenAI bodies, HTTP statuses, Retry-After and back from worker error events."""

from __future__ import annotations

import pytest

from shared import errors
from shared.errors import LLMFleetError


@pytest.mark.parametrize(
    ("cls", "status", "type_", "code"),
    [
        (errors.InvalidRequest, 400, "invalid_request_error", None),
        (errors.ContextLengthExceeded, 400, "invalid_request_error", "context_length_exceeded"),
        (errors.AuthenticationFailed, 401, "authentication_error", "invalid_api_key"),
        (errors.ModelNotFound, 404, "invalid_request_error", "model_not_found"),
        (errors.BodyTooLarge, 413, "invalid_request_error", None),
        (errors.QueueFull, 429, "rate_limit_error", "rate_limit_exceeded"),
        (errors.InternalError, 500, "server_error", None),
        (errors.NoWorkerAvailable, 503, "server_error", "no_worker_available"),
        (errors.Unavailable, 503, "server_error", "unavailable"),
        (errors.DeadlineExceeded, 504, "server_error", "deadline_exceeded"),
    ],
)
def test_table(cls: type[LLMFleetError], status: int, type_: str, code: str | None) -> None:
    error = cls("boom", param="p")
    assert isinstance(error, LLMFleetError)
    assert error.status == status
    assert error.to_openai() == {"error": {"message": "boom", "type": type_, "param": "p", "code": code}}
    back = LLMFleetError.from_event(error.to_event("req-1", 3))
    assert type(back) is cls
    assert back.to_openai() == error.to_openai()


def test_retry_after_header_is_whole_seconds() -> None:
    assert errors.QueueFull("busy", retry_after=1.2).headers() == {"Retry-After": "2"}
    assert errors.NoWorkerAvailable("none", retry_after=0.01).headers() == {"Retry-After": "1"}
    assert errors.InvalidRequest("bad").headers() == {}
    event = errors.QueueFull("busy", retry_after=3).to_event("r", 0)
    assert event.retry_after == 3
    assert LLMFleetError.from_event(event).headers() == {"Retry-After": "3"}


def test_unknown_event_keeps_its_own_status_type_and_code() -> None:
    event = errors.InvalidRequest("x").to_event("r", 0)
    odd = type(event)(id="r", seq=0, status=422, type="weird_error", code="odd", param=None, message="m")
    error = LLMFleetError.from_event(odd)
    assert (error.status, error.type, error.code) == (422, "weird_error", "odd")
    assert error.to_openai()["error"]["type"] == "weird_error"


def test_the_module_table_lists_every_error_as_it_is() -> None:
    """shared/errors.py's header table has one row per error class, with the class's status, type and code."""
    import inspect

    from shared import errors

    rows = {}
    for line in (errors.__doc__ or "").splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[1].isdigit():
            rows[cells[0]] = (int(cells[1]), cells[2], None if cells[3] == "None" else cells[3], cells[4] == "yes")
    classes = {name: cls for name, cls in vars(errors).items() if inspect.isclass(cls)
               and issubclass(cls, errors.LLMFleetError) and cls is not errors.LLMFleetError}
    assert set(rows) == set(classes)
    for name, cls in classes.items():
        assert rows[name][:3] == (cls.http_status, cls.error_type, cls.error_code), name
