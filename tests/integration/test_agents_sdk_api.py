"""Issue 42, the OpenAI Agents SDK, unmodified, on both of its model classes (chat completions and Responses) against
SmolLM2 workers: an agent with a forced tool at max_tokens 60 and 200 runs the tool and ends (the SDK raised
ModelBehaviorError when the forced call came back `incomplete`), and a second turn that carries the tool's result
back to the model is accepted. SmolLM2-135M's text is noise: the protocol is what is checked."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import pytest
from pydantic import Field

from tests.integration.test_tools_api import ASK, MODEL

agents = pytest.importorskip("agents", reason="the OpenAI Agents SDK (openai-agents, in the dev extra) is not installed")

pytestmark = [pytest.mark.slow, pytest.mark.integration]
CALLS: list[tuple[str, str]] = []


@agents.function_tool
def get_weather(city: Annotated[str, Field(max_length=40)], unit: Literal["celsius", "fahrenheit"]) -> str:
    """Current weather in a city."""
    CALLS.append((city, unit))
    return f"21 degrees {unit}"


def _agent(cluster: Any, api: str, max_tokens: int, behaviour: str) -> Any:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=cluster.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)
    model = (agents.OpenAIChatCompletionsModel(MODEL, client) if api == "chat"
             else agents.OpenAIResponsesModel(MODEL, client))
    settings = agents.ModelSettings(tool_choice="required", max_tokens=max_tokens, temperature=0)
    return agents.Agent(name="weather", instructions="Use the weather tool.", model=model, tools=[get_weather],
                        model_settings=settings, tool_use_behavior=behaviour)


@pytest.mark.parametrize("api", ["chat", "responses"])
@pytest.mark.parametrize("max_tokens", [60, 200])
def test_an_agent_with_a_forced_tool_runs_it_and_ends(cluster: Any, api: str, max_tokens: int) -> None:
    CALLS.clear()
    result = agents.Runner.run_sync(_agent(cluster, api, max_tokens, "stop_on_first_tool"), ASK[0]["content"],
                                    run_config=agents.RunConfig(tracing_disabled=True))
    assert len(CALLS) >= 1 and result.final_output == f"21 degrees {CALLS[0][1]}"


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_the_tools_result_goes_back_to_the_model(cluster: Any, api: str) -> None:
    """The SDK's default: after the call, tool_choice is reset to auto and the result is sent back; the model may
    answer or call again (its text is noise), so a run that reaches max_turns still proves every turn was accepted."""
    CALLS.clear()
    try:
        result = agents.Runner.run_sync(_agent(cluster, api, 60, "run_llm_again"), ASK[0]["content"], max_turns=3,
                                        run_config=agents.RunConfig(tracing_disabled=True))
    except agents.MaxTurnsExceeded:
        assert len(CALLS) >= 2  # the second turn was accepted and called the tool again
    else:
        assert CALLS and isinstance(result.final_output, str)
