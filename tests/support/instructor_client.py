"""Run by the instructor environment's own interpreter (instructor pins an older openai than the project's, so it
lives in a virtualenv of its own, `.venv-instructor`): one forced-tool extraction, unmodified instructor.

Usage: python instructor_client.py BASE_URL MODEL MODE MAX_TOKENS; prints the extracted object as JSON, or the
exception's class and message on stderr with exit status 1."""

from __future__ import annotations

import json
import sys
from typing import Literal

import instructor
from openai import OpenAI
from pydantic import BaseModel, Field


class Weather(BaseModel):
    """The weather question's arguments, as instructor's TOOLS modes extract them."""

    city: str = Field(max_length=40)
    unit: Literal["celsius", "fahrenheit"]


def main() -> int:
    """Extract one Weather from the server at argv[1] in instructor mode argv[3] with max_tokens argv[4]."""
    base_url, model, mode, max_tokens = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    client = instructor.from_openai(OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=180),
                                    mode=instructor.Mode[mode])
    ask = [{"role": "user", "content": "What is the weather in Paris right now?"}]
    try:
        weather = client.create(model=model, messages=ask, response_model=Weather, max_tokens=max_tokens,
                                temperature=0, max_retries=1)
    except Exception as error:  # the test reports instructor's own exception, whatever it is
        print(f"{type(error).__name__}: {error}", file=sys.stderr)
        return 1
    print(json.dumps(weather.model_dump()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
