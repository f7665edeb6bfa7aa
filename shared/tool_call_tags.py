"""The tags around a tool call in a reply's text: part of the wire contract, written once for both sides.

A reply carries its tool calls as text, one block per call in the canonical format:
    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>
The worker hands these tags to its engine (worker/serve/jobs.py), which writes the format instruction or the
template's history with them and holds the calls to their schemas with a grammar built on them
(worker/engine/text/tools.py); the gateway parses the calls out of the text between them
(gateway/replies/tool_calls.py). A harmony reply (gpt-oss) writes its calls in harmony's own tokens instead.
"""

from __future__ import annotations

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
