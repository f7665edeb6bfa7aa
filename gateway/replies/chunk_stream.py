"""The OpenAI chunks of one streaming chat or completion request (`data: {...}` bodies for gateway/http/sse.py).

Its first events already arrived (gateway/replies/serving.py `stream_completion` waited for them), so a failure
from here on is a final {"error": ...} chunk; the SSE layer appends [DONE].
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

from gateway.http.error_log import ErrorLog
from gateway.http.sse import Comment
from gateway.replies import bodies
from gateway.replies.bodies import ChunkHeader
from gateway.replies.parser import ReplyParser, needs_parsing
from gateway.replies.reasoning import BOTH_FIELDS
from gateway.replies.request_events import STILL_WAITING, RequestEvents
from gateway.replies.streaming import OpenStream, queued_comments, record_streamed_error
from shared.errors import InternalError, LLMFleetError
from shared.messages import TokenEvent

log = logging.getLogger(__name__)


class ChunkStream(OpenStream):
    """The OpenAI chunks of one streaming request, whose first events already arrived."""

    def __init__(self, request_events: RequestEvents, header: ChunkHeader, *, chat: bool, logprobs: bool,
                 tools: bool = False, timings: bool = False, errors: ErrorLog | None = None,
                 priming: asyncio.Task[None] | None = None, keepalive_s: float = 10.0, reasoning: bool = False,
                 reply_format: str = "default", reasoning_keys: tuple[str, ...] = BOTH_FIELDS) -> None:
        self._request_events = request_events
        self._reasoning_keys = reasoning_keys  # the delta fields reasoning goes out under (LLMFLEET_REASONING_FIELDS)
        self._timings = timings
        self._errors = errors
        self._priming = priming  # still waiting for the first events: the stream opens with `: queued`
        self._keepalive_s = keepalive_s
        self._header = header
        self._chat = chat
        self._logprobs = logprobs
        self._parsers = [ReplyParser(reasoning=reasoning, tools=tools, reply_format=reply_format)
                         for _ in range(request_events.choices)] \
            if needs_parsing(reply_format, chat=chat, reasoning=reasoning, tools=tools) else None

    def _record(self, error: LLMFleetError) -> None:
        """Add an error sent after the stream began to the fleet's recent errors."""
        record_streamed_error(self._errors, error, "/v1/chat/completions" if self._chat else "/v1/completions")

    def __aiter__(self) -> AsyncIterator[dict[str, Any] | Comment]:
        return self._chunks()

    async def _chunks(self) -> AsyncIterator[dict[str, Any] | Comment]:
        header, started = self._header, [False] * self._request_events.choices
        offsets = [bodies.TextOffsets() for _ in range(self._request_events.choices)]
        try:
            async for comment in queued_comments(self._priming, self._keepalive_s):
                yield comment
            while (item := await self._request_events.next_within(self._keepalive_s)) is not None:
                if item is STILL_WAITING:  # no event for a while (failover, Redis pause): show the stream lives
                    yield Comment("keep-alive")
                    continue
                index, event = item
                if self._chat and not started[index]:
                    started[index] = True
                    yield bodies.chat_chunk(header, index, {"role": "assistant", "content": ""})
                if isinstance(event, TokenEvent):
                    for chunk in self._token_chunks(index, event, offsets[index]):
                        yield chunk
                else:
                    for chunk in self._finish_chunks(index, event.finish_reason):
                        yield chunk
            last = self._last_chunk()
            self.ended()
            if last is not None:
                yield last
            log.info("%s streamed: %d completion tokens", header.response_id, self._request_events.usage.completion_tokens)
        except LLMFleetError as exc:
            log.info("%s failed after the stream began: %s %s", header.response_id, exc.status, exc.code)
            self._record(exc)
            self.ended()
            yield exc.to_openai()
        except Exception:  # a bug: still end the stream properly, with an error and [DONE]
            log.exception("%s broke after the stream began", header.response_id)
            error = InternalError("The server had an error while processing your request.")
            self._record(error)
            self.ended()
            yield error.to_openai()
        finally:
            await self.aclose()

    def _token_chunks(self, index: int, event: TokenEvent, offsets: bodies.TextOffsets) -> list[dict[str, Any]]:
        """The chunks of one choice's token event: its text (split into reasoning, content and tool calls when
        parsed, never a partial tag as content) with its logprobs; none for an empty event."""
        header = self._header
        entries = (event.logprobs or []) if self._logprobs else None
        if not event.text and not entries:
            return []
        if self._parsers:
            parts = self._parsers[index].feed(event.text)
            if parts == [event.text]:  # passed through unchanged: it keeps its logprobs
                return [bodies.chat_chunk(header, index, {"content": event.text}, entries)]
            return [bodies.chat_chunk(header, index, bodies.part_delta(part, self._reasoning_keys)) for part in parts]
        if self._chat:
            return [bodies.chat_chunk(header, index, {"content": event.text}, entries)]
        logprobs = None if entries is None else bodies.completion_logprobs(entries, offsets)
        return [bodies.completion_chunk(header, index, event.text, logprobs)]

    def _finish_chunks(self, index: int, reason: str) -> list[dict[str, Any]]:
        """The chunks that end one choice: what its parser held back, then its finish reason."""
        header, chunks = self._header, []
        if self._parsers:
            chunks = [bodies.chat_chunk(header, index, bodies.part_delta(part, self._reasoning_keys))
                      for part in self._parsers[index].finish()]
            reason = self._parsers[index].finish_reason(reason)
        if self._chat:
            return [*chunks, bodies.chat_chunk(header, index, {}, finish_reason=reason)]
        return [*chunks, bodies.completion_chunk(header, index, "", finish_reason=reason)]

    def _last_chunk(self) -> dict[str, Any] | None:
        """The usage chunk (stream_options.include_usage) and llama-server's timings, if asked for."""
        obj = "chat.completion.chunk" if self._chat else "text_completion"
        dropped = sum(parser.dropped for parser in self._parsers or [])
        last = self._header.usage_chunk(obj, self._request_events.usage, dropped) if self._header.include_usage else None
        if self._timings:  # as llama-server: the stream's last chunk carries the timings
            last = last or self._header.chunk(obj, [])
            last["timings"] = bodies.timings_body(self._request_events.usage, self._request_events.timings)
        return last
