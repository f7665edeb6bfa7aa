"""A greedy streamed completion through the unmodified openai client that records when each text piece arrived: the
probe the kill -9 tests run before and through a fault, comparing texts and measuring the longest silence."""

from __future__ import annotations

import time
from typing import Any

import openai

from tests.support.cluster import MODEL


def stream_completion(base: str, result: dict[str, Any], prompt: str, max_tokens: int, model: str = MODEL) -> None:
    """Stream one completion (temperature 0, ignore_eos) into `result`: "times" (monotonic arrival of each text
    piece), then "text", or "error" with what ended it."""
    client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=120)
    times: list[float] = []
    pieces: list[str] = []
    result["times"] = times
    try:
        for chunk in client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                               stream=True, extra_body={"ignore_eos": True}):
            if chunk.choices and chunk.choices[0].text:
                times.append(time.monotonic())
                pieces.append(chunk.choices[0].text)
        result["text"] = "".join(pieces)
    except openai.APIError as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
