"""The harmony end-to-end tests (test_harmony_api.py) that hold on a model writing noise, run on the tiny gpt-oss
twin itself (bench/synthetic_model.py: the `gpt-oss` architecture with MXFP4 experts, sinks and sliding windows,
gpt-oss's tokenizer keys and template): a forced tool call and its round trip, streamed and collected, and structured
output in the final channel, on chat completions and the Responses API (reasoning effort kept, the call's output sent
back by previous_response_id), with the unmodified openai client; and the OpenAI Agents SDK's forced tool call on both
of its model classes. The twin's text is noise; the protocol must hold."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import openai
import pytest

from llmfleet.local_cluster import LocalCluster
from tests.integration.test_harmony_api import (  # noqa: F401 (collected here against the twin)
    MODEL,
    test_a_forced_call_and_its_round_trip,
    test_responses_api_calls_and_formats,
    test_structured_output_is_the_final_channel,
)
from tests.support.cluster import serving_file_as

pytestmark = [pytest.mark.slow, pytest.mark.integration]


@pytest.fixture(scope="module")
def twin_cluster(twin_path: Callable[[str, str], Path],
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Redis, a gateway and one worker serving the tiny gpt-oss twin (MXFP4 where llama-quantize is built). Its
    template writes the day's date into every prompt, and whether the twin's noise picks the analysis or the final
    channel first moves with it (on 2026-11-30 it stayed in analysis for all 40 tokens): the date is pinned."""
    from bench.llama_oracle import llama_quantize_binary

    twin = twin_path("gpt-oss", "MXFP4_MOE" if llama_quantize_binary() else "F16")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LLMFLEET_TEMPLATE_NOW", "2026-11-29T12:00:00")
        with serving_file_as(twin, MODEL, tmp_path_factory.mktemp("twin-logs")) as running:
            yield running


@pytest.fixture(scope="module")
def client(twin_cluster: LocalCluster) -> openai.OpenAI:
    """The official client against the twin's cluster."""
    return openai.OpenAI(base_url=twin_cluster.base_url + "/v1", api_key="unused", max_retries=0, timeout=180)


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_the_agents_sdk_runs_a_forced_tool_on_the_twin(twin_cluster: LocalCluster, api: str) -> None:
    pytest.importorskip("agents", reason="the OpenAI Agents SDK (openai-agents, in the dev extra) is not installed")
    from tests.integration.test_agents_sdk_api import run_forced

    run_forced(twin_cluster.base_url, api, 200, MODEL)
