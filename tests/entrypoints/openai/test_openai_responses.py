"""/v1/responses through the OpenAI SDK's client.responses.create with the default model:
text, a conversation over previous_response_id, store: false, a function-tool round trip,
streamed typed events; and the stream writer fed a recorded reasoning + call reply one
character at a time against the whole reply's items."""
from __future__ import annotations

import itertools
import json

import httpx
import openai
import pytest
from default_server import MODEL, WEATHER, default_server, oai  # noqa: F401  (fixtures)
from openai_server import API_KEY

from jaxvllm.entrypoints.openai.message_parser import MessageParser
from jaxvllm.entrypoints.openai.reasoning import ReasoningParserManager
from jaxvllm.entrypoints.openai.responses_stream import ItemWriter
from jaxvllm.entrypoints.openai.serving_responses import OpenAIServingResponses
from jaxvllm.entrypoints.openai.tool_parsers import ToolParserManager

TOOL = {"type": "function", **WEATHER["function"]}


@pytest.mark.slow
def test_text_and_previous_response_id(oai, default_server):
    first = oai.responses.create(model=MODEL, input="Name a color.", max_output_tokens=6, temperature=0)
    assert first.object == "response" and first.output_text
    assert first.status == "incomplete" or first.status == "completed"
    assert first.usage.output_tokens <= 6 and first.usage.total_tokens == (
        first.usage.input_tokens + first.usage.output_tokens)
    got = httpx.get(f"{default_server.url}/v1/responses/{first.id}",
                    headers={"Authorization": f"Bearer {API_KEY}"}).json()
    assert got["output"][0]["content"][0]["text"] == first.output_text
    alone = oai.responses.create(model=MODEL, input=[{"role": "user", "content": "And another?"}],
                                 max_output_tokens=4, temperature=0, store=False)
    second = oai.responses.create(model=MODEL, input="And another?", previous_response_id=first.id,
                                  max_output_tokens=4, temperature=0)
    # The second turn's prompt holds the first question and answer.
    assert second.usage.input_tokens > alone.usage.input_tokens + first.usage.output_tokens
    with pytest.raises(openai.BadRequestError, match="previous_response_id|not found"):
        oai.responses.create(model=MODEL, input="x", previous_response_id=alone.id, max_output_tokens=2)


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_function_tool_round_trip(oai, stream):
    args = dict(model=MODEL, input="What is the weather in Paris?", tools=[TOOL], tool_choice="required",
                parallel_tool_calls=False, max_output_tokens=40, temperature=0)
    if stream:
        events = list(oai.responses.create(stream=True, **args))
        kinds = [e.type for e in events]
        assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
        assert kinds[-3:] == ["response.function_call_arguments.done", "response.output_item.done",
                              "response.completed"]
        assert [e.sequence_number for e in events] == list(range(len(events)))
        deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
        response = events[-1].response
        assert deltas == response.output[0].arguments
    else:
        response = oai.responses.create(**args)
    (call,) = response.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert isinstance(json.loads(call.arguments)["city"], str)
    final = oai.responses.create(
        model=MODEL, previous_response_id=response.id, tools=[TOOL], tool_choice="none",
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21 C."}],
        max_output_tokens=8, temperature=0, stream=stream)
    if stream:
        events = list(final)
        text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        final = events[-1].response
        assert text == final.output_text
    assert final.output_text and final.output[0].type == "message"


@pytest.mark.slow
def test_bad_responses_input_is_a_400_and_the_next_is_served(oai):
    for bad, param in [(dict(input=[{"type": "image_generation_call"}]), "input[0].type"),
                       (dict(input=[{"role": "robot", "content": "x"}]), "input[0].role"),
                       (dict(input="x", tools=[{"type": "web_search"}]), "tools[0].type"),
                       (dict(input="x", tools=[{**TOOL, "parameters": {"type": "array"}}],
                             tool_choice="required"), "tools[0].parameters")]:
        with pytest.raises(openai.BadRequestError) as e:
            oai.responses.create(model=MODEL, max_output_tokens=2, **bad)
        assert e.value.body["param"] == param, e.value.body
    assert oai.responses.create(model=MODEL, input="Hi", max_output_tokens=2).output_text


REPLY = ('<think>\nThe user wants the weather.\n</think>\n\nLet me look.\n<tool_call>\n'
         '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>')


def test_stream_writer_gives_the_whole_replys_items():
    make = lambda: MessageParser(ReasoningParserManager.get_reasoning_parser("qwen3")(), False,
                                 ToolParserManager.get_tool_parser("hermes")(), [WEATHER])
    whole = [i.dump() for i in OpenAIServingResponses._items(make().full(REPLY))]
    parser, writer = make(), ItemWriter(itertools.count())
    events = [e for i, ch in enumerate(REPLY) for e in writer.feed(parser.feed(ch, i == len(REPLY) - 1))]
    events += list(writer.close())
    events = [json.loads(e.split("data: ", 1)[1]) for e in events]
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    strip = lambda items: [{k: v for k, v in i.items() if k not in ("id", "call_id")} for i in items]
    assert strip(done) == strip(whole) and [i["type"] for i in done] == ["reasoning", "message",
                                                                          "function_call"]
    assert [e["type"] for e in events][:4] == [
        "response.output_item.added", "response.content_part.added",
        "response.reasoning_text.delta", "response.reasoning_text.delta"]
