"""Tool calling and reasoning on /v1/chat/completions with the default model, through the
OpenAI SDK: a two-turn tool loop with tool_choice "required" and a named function (streamed
and not), "auto" read by the hermes parser, a reasoning split, and an agent framework from
PyPI (openai-agents) running one tool-using turn over both APIs."""
from __future__ import annotations

import asyncio
import json

import pytest
from default_server import MODEL, WEATHER, default_server, oai  # noqa: F401  (fixtures)
from openai_server import API_KEY

pytestmark = pytest.mark.slow
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]


def _streamed(chunks):
    """(content, reasoning, [(id, name, arguments)], finish_reason) from a chat stream."""
    content, reasoning, calls, finish = "", "", {}, None
    for chunk in chunks:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        delta = choice.delta
        content += delta.content or ""
        reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
        for tc in delta.tool_calls or []:
            if tc.id is not None:  # the first delta of a call: id, type and the whole name
                assert tc.index not in calls and tc.type == "function" and tc.function.name
                calls[tc.index] = [tc.id, tc.function.name, ""]
            calls[tc.index][2] += tc.function.arguments or ""
        finish = choice.finish_reason or finish
    return content, reasoning, [tuple(c) for c in calls.values()], finish


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}],
                         ids=["required", "named"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_two_turn_tool_loop(oai, choice, stream):
    args = dict(model=MODEL, tools=[WEATHER], tool_choice=choice, parallel_tool_calls=False,
                max_completion_tokens=40, temperature=0)
    if stream:
        _, _, calls, finish = _streamed(oai.chat.completions.create(messages=QUESTION, stream=True, **args))
    else:
        reply = oai.chat.completions.create(messages=QUESTION, **args).choices[0]
        assert reply.message.content is None
        calls = [(c.id, c.function.name, c.function.arguments) for c in reply.message.tool_calls]
        finish = reply.finish_reason
    assert finish == "tool_calls" and len(calls) == 1
    call_id, name, arguments = calls[0]
    assert name == "get_weather" and isinstance(json.loads(arguments)["city"], str)
    turn = [*QUESTION, {"role": "assistant", "content": None, "tool_calls": [
        {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": call_id, "content": "Sunny, 21 C."}]
    final = oai.chat.completions.create(model=MODEL, messages=turn, tools=[WEATHER], tool_choice="none",
                                        max_completion_tokens=8, temperature=0)
    assert final.choices[0].message.content and not final.choices[0].message.tool_calls
    assert final.usage.prompt_tokens > 150  # the tools, the call and its result were rendered


def weather_with_unit(strict: bool) -> dict:
    """Issue 71's tool: no additionalProperties, as a new user writes it."""
    return {"type": "function", "function": {
        "name": "get_weather", "description": "The current weather of a city.", **({"strict": True} if strict else {}),
        "parameters": {"type": "object", "required": ["city", "unit"], "properties": {
            "city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}}}}}


@pytest.mark.parametrize("strict", [False, True], ids=["loose", "strict"])
@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}],
                         ids=["required", "named"])
def test_greedy_calls_end_holding_only_declared_keys(oai, choice, strict):
    """The default model, greedy, with room to ramble: the call ends (undeclared keys are
    refused by default, as vLLM's grammar backend does, and whitespace is bounded)."""
    reply = oai.chat.completions.create(model=MODEL, messages=QUESTION, tools=[weather_with_unit(strict)],
                                        tool_choice=choice, temperature=0, max_completion_tokens=128).choices[0]
    assert reply.finish_reason == "tool_calls" and reply.message.tool_calls, reply
    for call in reply.message.tool_calls:
        arguments = json.loads(call.function.arguments)
        assert call.function.name == "get_weather" and set(arguments) <= {"city", "unit"}, arguments
        assert not strict or set(arguments) == {"city", "unit"}


# What the hermes format looks like, forced through the structured-output backend.
HERMES_CALL = r'<tool_call>\n\{"name": "get_weather", "arguments": \{"city": "[A-Z][a-z]{1,8}"\}\}\n</tool_call>'


def test_auto_reads_calls_in_the_parsers_format(oai):
    args = dict(model=MODEL, messages=QUESTION, tools=[WEATHER], max_completion_tokens=40,
                temperature=0, extra_body={"structured_outputs": {"regex": HERMES_CALL}})
    reply = oai.chat.completions.create(**args).choices[0]
    assert reply.finish_reason == "tool_calls" and reply.message.content is None
    (call,) = reply.message.tool_calls
    assert call.function.name == "get_weather" and call.id.startswith("call_")
    content, _, calls, finish = _streamed(oai.chat.completions.create(stream=True, **args))
    assert (content, finish) == ("", "tool_calls")
    assert [(n, a) for _, n, a in calls] == [(call.function.name, call.function.arguments)]


def test_reasoning_is_split_streamed_and_not(oai):
    args = dict(model=MODEL, messages=[{"role": "user", "content": "Say hi."}], max_completion_tokens=48,
                temperature=0, extra_body={"structured_outputs": {
                    "regex": r"<think>\n[a-z ]{1,24}\n</think>\n\n[A-Za-z !]{1,12}"}})
    message = oai.chat.completions.create(**args).choices[0].message
    reasoning = message.model_extra["reasoning_content"]
    assert reasoning.startswith("\n") and reasoning.endswith("\n") and "<think>" not in reasoning
    assert message.content and "</think>" not in message.content
    content, streamed_reasoning, calls, _ = _streamed(oai.chat.completions.create(stream=True, **args))
    assert (streamed_reasoning, content, calls) == (reasoning, message.content, [])


def test_openai_agents_runs_one_tool_turn(default_server):
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        OpenAIResponsesModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    cities = []

    @function_tool
    def get_weather(city: str) -> str:
        """The current weather of a city."""
        cities.append(city)
        return f"Sunny, 21 C in {city}."

    async def run_both():
        client = AsyncOpenAI(base_url=default_server.url + "/v1", api_key=API_KEY, max_retries=0)
        outputs = []
        for model in (OpenAIResponsesModel(MODEL, client), OpenAIChatCompletionsModel(MODEL, client)):
            agent = Agent(name="weather", instructions="Use the tool.", tools=[get_weather],
                          model=model, tool_use_behavior="stop_on_first_tool",
                          model_settings=ModelSettings(tool_choice="required", parallel_tool_calls=False,
                                                       max_tokens=40, temperature=0))
            outputs.append((await Runner.run(agent, "What is the weather in Paris?", max_turns=2)).final_output)
        return outputs

    outputs = asyncio.run(run_both())
    assert len(cities) == 2 and outputs == [f"Sunny, 21 C in {c}." for c in cities]


def test_tokenize_renders_tools_as_chat_does(default_server):
    import httpx
    count = lambda **extra: httpx.post(f"{default_server.url}/tokenize", json={
        "messages": QUESTION, **extra}, headers={"Authorization": f"Bearer {API_KEY}"}).json()["count"]
    assert count(tools=[WEATHER]) > count() + 50
