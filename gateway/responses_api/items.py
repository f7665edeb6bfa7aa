"""Responses API items: their ids, `item_reference` inputs, and the input_items listing.

Every item a response stores (its new input items and its output items) has an id whose digits name the
response: `{prefix}_{response digits}{16 random hex digits}`. So an `item_reference` {type: item_reference, id}
is found without an index of items: first among the items of the previous_response_id chain, else in the
stored response its id names (same API key, or it is not found: a 404 naming the input item). An input item
that brings its own id (an output item sent back as input, as `input += response.output` does) keeps it.
GET /v1/responses/{id}/input_items lists the items the response read (the chain's earlier items, then its
own input), as OpenAI's cursor page: order desc (default) or asc, limit 1-100 (default 20), after / before.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from typing import Any

from gateway.http.fields import invalid
from gateway.responses_api.store import ResponseStore
from shared.errors import NotFound, ResponseNotFound

ITEM_PREFIXES = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "reasoning": "rs"}
_ITEM_ID = re.compile(r"^[a-z]+_([0-9a-f]{1,64})[0-9a-f]{16}$")
MAX_ITEM_ID_CHARS = 128
DEFAULT_LIMIT, MAX_LIMIT = 20, 100


def item_id(prefix: str, rid: str, ordinal: int | None = None) -> str:
    """A fresh id of an item of response `rid`: `prefix` ('msg', 'fc', ...), its digits, 16 random hex digits (or,
    for the `ordinal`-th output item, 16 derived from the response id: a resumed stream names it the same)."""
    tail = secrets.token_hex(8) if ordinal is None else hashlib.sha256(f"{rid}/{ordinal}".encode()).hexdigest()[:16]
    return f"{prefix}_{rid.removeprefix('resp_')}{tail}"


def response_of_item(item: str) -> str | None:
    """The response id an item id names (None for an id made elsewhere)."""
    match = _ITEM_ID.match(item)
    return f"resp_{match.group(1)}" if match else None


def with_ids(items: list[dict[str, Any]], rid: str) -> list[dict[str, Any]]:
    """New input items with ids (kept where the client sent one)."""
    return [item if "id" in item else {"id": item_id(ITEM_PREFIXES[item["type"]], rid), **item} for item in items]


def reference_id(item: dict[str, Any], where: str) -> str:
    """The id of an item_reference input item."""
    value = item.get("id")
    if not isinstance(value, str) or not 0 < len(value) <= MAX_ITEM_ID_CHARS:
        raise invalid(f"{where}.id", f"expected an item id of at most {MAX_ITEM_ID_CHARS} characters.")
    return value


def find_item(candidates: list[dict[str, Any]], wanted: str) -> dict[str, Any] | None:
    """The item with id `wanted` among candidates (the last one: a later copy of the same item wins)."""
    found = [item for item in candidates if item.get("id") == wanted]
    return found[-1] if found else None


def not_found(wanted: str, where: str) -> NotFound:
    """The 404 of an item_reference that names no stored item."""
    return NotFound(f"Item with id '{wanted}' not found.", param=where)


async def resolve_references(store: ResponseStore, items: list[dict[str, Any]], history: list[dict[str, Any]],
                    key: str | None) -> list[dict[str, Any]]:
    """Input items with each item_reference replaced by the stored item it names: one of the previous_response_id
    chain, else one of the response its id names (404 when neither has it)."""
    out = []
    for i, item in enumerate(items):
        if item["type"] != "item_reference":
            out.append(item)
            continue
        wanted, where = item["id"], f"input[{i}]"
        found = find_item(history, wanted)
        owner = response_of_item(wanted)
        if found is None and owner is not None:
            try:
                record = await store.load(owner, key)
            except ResponseNotFound:
                raise not_found(wanted, where) from None
            found = find_item([*record.history, *record.response["output"]], wanted)
        if found is None:
            raise not_found(wanted, where)
        out.append(_stored_as_input(found))
    return out


def _stored_as_input(item: dict[str, Any]) -> dict[str, Any]:
    """A stored item (input or output) in the canonical input shape."""
    if item["type"] == "reasoning":
        return {"id": item["id"], "type": "reasoning", "summary": [], "content": item["content"]}
    if item["type"] == "message":
        role = item["role"]
        part = "output_text" if role == "assistant" else "input_text"
        return {"id": item["id"], "type": "message", "role": role,
                "content": [{"type": part, "text": p["text"]} for p in item["content"]]}
    keep = ("id", "type", "call_id", "name", "arguments") if item["type"] == "function_call" else \
        ("id", "type", "call_id", "output")
    return {name: item[name] for name in keep}


def page(items: list[dict[str, Any]], query: dict[str, str]) -> dict[str, Any]:
    """One cursor page of items (OpenAI's list object): order, limit, after and before from the query string."""
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise invalid("order", "expected 'asc' or 'desc'.")
    raw_limit = query.get("limit", str(DEFAULT_LIMIT))
    if not raw_limit.isdigit() or not 1 <= int(raw_limit) <= MAX_LIMIT:
        raise invalid("limit", f"expected an integer between 1 and {MAX_LIMIT}.")
    ordered = list(reversed(items)) if order == "desc" else list(items)
    ids = [item["id"] for item in ordered]
    start, end = 0, len(ordered)
    for name in ("after", "before"):
        cursor = query.get(name)
        if cursor is None:
            continue
        if cursor not in ids:
            raise invalid(name, f"no input item with id '{cursor[:MAX_ITEM_ID_CHARS]}' in this response.")
        if name == "after":
            start = ids.index(cursor) + 1
        else:
            end = ids.index(cursor)
    window = ordered[start:end]
    data = window[:int(raw_limit)]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": len(window) > len(data)}


def listed(item: dict[str, Any], rid: str, index: int) -> dict[str, Any]:
    """A stored item as the listing shows it: with a status, and an id even if stored without one."""
    fallback = f"{ITEM_PREFIXES.get(item['type'], 'item')}_{rid.removeprefix('resp_')}{index:016x}"
    return {"id": fallback, **item, "status": item.get("status", "completed")}
