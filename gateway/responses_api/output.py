"""The output items of a streamed response (gateway/responses_api/serving.py): opens, fills and closes them in order,
as the typed events that carry them (unnumbered: the stream numbers them)."""

from __future__ import annotations

from typing import Any

from gateway.replies.parser import Part
from gateway.replies.reasoning import Reasoning
from gateway.replies.tool_calls import ArgumentsDelta, CallStart
from gateway.responses_api import bodies
from gateway.responses_api.items import item_id


class Output:
    """The output items of a streamed response: opens, fills and closes them in order (events unnumbered)."""

    def __init__(self, rid: str) -> None:
        self._rid = rid  # item ids name their response (gateway/responses_api/items.py)
        self.items: list[dict[str, Any]] = []
        self._message: dict[str, Any] | None = None  # the message item being filled
        self._reasoning: dict[str, Any] | None = None  # the reasoning item being filled (it comes first)
        self._call: dict[str, Any] | None = None  # a call whose arguments are still coming
        self._deltas: list[str] = []
        self._ids = 0

    def _next_id(self, prefix: str) -> str:
        """The next output item's id: the same on every rendering of the response's events."""
        self._ids += 1
        return item_id(prefix, self._rid, self._ids)

    def add(self, piece: Part) -> list[dict[str, Any]]:
        """The events that carry one piece of parsed output: thinking, text, a call's start, or its arguments."""
        if isinstance(piece, Reasoning):
            return self._think(piece.text)
        return self._close_reasoning("completed") + self._answer(piece)

    def _answer(self, piece: Part) -> list[dict[str, Any]]:
        if isinstance(piece, ArgumentsDelta):
            assert self._call is not None
            self._call["arguments"] += piece.text
            self._deltas.append(piece.text)
            return []
        if isinstance(piece, CallStart):
            events = self._close_message("completed") + self._flush_call()
            self._call, self._deltas = {"id": piece.id, "name": piece.name, "arguments": ""}, []
            return events
        if not piece:
            return []
        events = self._flush_call() + self._open_message()
        assert self._message is not None
        self._message["text"] += piece
        return [*events, {**self._part_ref(), "type": "response.output_text.delta", "delta": piece, "logprobs": []}]

    def close(self, finish_reason: str | None) -> list[dict[str, Any]]:
        """Close what is open at the end of the reply (an empty reply is one empty message)."""
        status = "incomplete" if finish_reason in ("length", "cancelled") else "completed"
        events = self._close_reasoning(status) + self._close_message(status) + self._flush_call()
        if not self.items:
            events = self._open_message() + self._close_message(status)
        return events

    def _think(self, text: str) -> list[dict[str, Any]]:
        """A piece of the thinking block: opens the reasoning item on the first one."""
        if not text or (self._reasoning is not None and "text" not in self._reasoning):
            return []  # the splitter sends all thinking before the answer: nothing comes after it closed
        events = []
        if self._reasoning is None:
            self._reasoning = bodies.reasoning_item(self._next_id("rs"), None, "in_progress")
            self.items.append(self._reasoning)
            events.append({"type": "response.output_item.added", "output_index": len(self.items) - 1,
                           "item": dict(self._reasoning)})
            self._reasoning["text"] = ""
        self._reasoning["text"] += text
        return [*events, {**self._reasoning_ref(), "type": "response.reasoning_text.delta", "delta": text}]

    def _reasoning_ref(self) -> dict[str, Any]:
        assert self._reasoning is not None
        return {"item_id": self._reasoning["id"], "output_index": self.items.index(self._reasoning),
                "content_index": 0}

    def _close_reasoning(self, status: str) -> list[dict[str, Any]]:
        if self._reasoning is None or "text" not in self._reasoning:
            return []
        ref, text = self._reasoning_ref(), self._reasoning.pop("text")
        item = bodies.reasoning_item(self._reasoning["id"], text, status)
        self.items[ref["output_index"]] = self._reasoning = item  # closed: later thinking opens nothing new
        return [{**ref, "type": "response.reasoning_text.done", "text": text},
                {"type": "response.output_item.done", "output_index": ref["output_index"], "item": item}]

    def _open_message(self) -> list[dict[str, Any]]:
        if self._message is not None:
            return []
        self._message = bodies.message_item(self._next_id("msg"), None, "in_progress")
        index = len(self.items)
        self.items.append(self._message)
        events = [{"type": "response.output_item.added", "output_index": index, "item": dict(self._message)},
                  {**self._part_ref(), "type": "response.content_part.added", "part": bodies.text_part("")}]
        self._message["text"] = ""
        return events

    def _part_ref(self) -> dict[str, Any]:
        assert self._message is not None
        return {"item_id": self._message["id"], "output_index": self.items.index(self._message), "content_index": 0}

    def _close_message(self, status: str) -> list[dict[str, Any]]:
        if self._message is None:
            return []
        ref, text = self._part_ref(), self._message.pop("text")
        index = ref["output_index"]
        item = bodies.message_item(self._message["id"], text, status)
        self.items[index], self._message = item, None
        return [{**ref, "type": "response.output_text.done", "text": text, "logprobs": []},
                {**ref, "type": "response.content_part.done", "part": bodies.text_part(text)},
                {"type": "response.output_item.done", "output_index": index, "item": item}]

    def _flush_call(self) -> list[dict[str, Any]]:
        """Announce the pending call now that it is over, if its arguments are whole JSON; else drop it."""
        call, deltas, self._call, self._deltas = self._call, self._deltas, None, []
        if call is None or not bodies.is_complete_call(call["arguments"]):
            return []
        index, item = len(self.items), bodies.call_item(self._next_id("fc"), call)
        self.items.append(item)
        ref = {"item_id": item["id"], "output_index": index}
        events: list[dict[str, Any]] = [{"type": "response.output_item.added", "output_index": index,
                                         "item": {**item, "status": "in_progress", "arguments": ""}}]
        events += [{**ref, "type": "response.function_call_arguments.delta", "delta": delta} for delta in deltas]
        events.append({**ref, "type": "response.function_call_arguments.done", "name": call["name"],
                       "arguments": call["arguments"]})
        return [*events, {"type": "response.output_item.done", "output_index": index, "item": item}]
