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


def weather_agent(base_url: str, api: str, max_tokens: int, behaviour: str, model_name: str = MODEL) -> Any:
    """An agent forced to call get_weather, on one of the SDK's two model classes against base_url."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=180)
    model = (agents.OpenAIChatCompletionsModel(model_name, client) if api == "chat"
             else agents.OpenAIResponsesModel(model_name, client))
    settings = agents.ModelSettings(tool_choice="required", max_tokens=max_tokens, temperature=0)
    return agents.Agent(name="weather", instructions="Use the weather tool.", model=model, tools=[get_weather],
                        model_settings=settings, tool_use_behavior=behaviour)


@pytest.mark.parametrize("api", ["chat", "responses"])
@pytest.mark.parametrize("max_tokens", [60, 200])
def test_an_agent_with_a_forced_tool_runs_it_and_ends(cluster: Any, api: str, max_tokens: int) -> None:
    run_forced(cluster.base_url, api, max_tokens)


def run_forced(base_url: str, api: str, max_tokens: int, model_name: str = MODEL) -> None:
    """Run the forced agent to its first tool call: the tool ran and its result is the run's output."""
    CALLS.clear()
    result = agents.Runner.run_sync(weather_agent(base_url, api, max_tokens, "stop_on_first_tool", model_name),
                                    ASK[0]["content"], run_config=agents.RunConfig(tracing_disabled=True))
    assert len(CALLS) >= 1 and result.final_output == f"21 degrees {CALLS[0][1]}"


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_the_tools_result_goes_back_to_the_model(cluster: Any, api: str) -> None:
    """The SDK's default: after the call, tool_choice is reset to auto and the result is sent back; the model may
    answer or call again (its text is noise), so a run that reaches max_turns still proves every turn was accepted."""
    CALLS.clear()
    try:
        result = agents.Runner.run_sync(weather_agent(cluster.base_url, api, 60, "run_llm_again"), ASK[0]["content"], max_turns=3,
                                        run_config=agents.RunConfig(tracing_disabled=True))
    except agents.MaxTurnsExceeded:
        assert len(CALLS) >= 2  # the second turn was accepted and called the tool again
    else:
        assert CALLS and isinstance(result.final_output, str)
