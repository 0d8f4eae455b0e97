"""The server's reply models, dumped as the server sends them, validate against the OpenAI
SDK's own pydantic types (which say what the SDK reads): chat completions and chunks with
tool calls, completions, the model list, and /v1/responses objects and stream events."""
from __future__ import annotations

import itertools
import json

import pydantic
from openai.types import Completion, Model
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response, ResponseStreamEvent

from jaxvllm.entrypoints.openai.message_parser import MessageParser
from jaxvllm.entrypoints.openai.protocol_replies import (
    ChatCompletionResponse,
    ChatCompletionResponseChoice,
    ChatCompletionStreamChoice,
    ChatCompletionStreamResponse,
    ChatMessageReply,
    CompletionResponse,
    CompletionResponseChoice,
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
    FunctionCall,
    ModelCard,
    ModelList,
    ToolCall,
    UsageInfo,
)
from jaxvllm.entrypoints.openai.reasoning import ReasoningParserManager
from jaxvllm.entrypoints.openai.responses_stream import ItemWriter
from jaxvllm.entrypoints.openai.serving_responses import OpenAIServingResponses
from jaxvllm.entrypoints.openai.tool_parsers import ToolParserManager

CALL = ToolCall(id="call_1", function=FunctionCall(name="f", arguments='{"a": 1}'))


def test_chat_replies_validate_as_the_sdks_types():
    whole = ChatCompletionResponse(id="c", created=1, model="m", usage=UsageInfo.of(3, 4), choices=[
        ChatCompletionResponseChoice(index=0, message=ChatMessageReply(content=None, tool_calls=[CALL]),
                                     logprobs=None, finish_reason="tool_calls", stop_reason=None)]).dump()
    parsed = ChatCompletion.model_validate(whole)
    assert parsed.choices[0].message.tool_calls[0].function.arguments == '{"a": 1}'
    assert whole["object"] == "chat.completion" and "prompt_logprobs" not in whole
    for delta in (DeltaMessage(role="assistant", content=""),
                  DeltaMessage(tool_calls=[DeltaToolCall(index=0, id="call_1", type="function",
                                                         function=DeltaFunctionCall(name="f", arguments=""))]),
                  DeltaMessage(tool_calls=[DeltaToolCall(index=0, function=DeltaFunctionCall(arguments="{"))]),
                  DeltaMessage(reasoning_content="hm")):
        chunk = ChatCompletionStreamResponse(id="c", created=1, model="m", choices=[
            ChatCompletionStreamChoice(index=0, delta=delta, finish_reason=None)]).dump()
        ChatCompletionChunk.model_validate(chunk)
        assert set(chunk["choices"][0]["delta"]) == set(delta.model_fields_set)


def test_completion_and_model_replies_validate_as_the_sdks_types():
    reply = CompletionResponse(id="x", created=1, model="m", usage=UsageInfo.of(1, 2), choices=[
        CompletionResponseChoice(index=0, text="hi", logprobs=None, finish_reason="length")])
    assert Completion.model_validate(reply.dump()).choices[0].text == "hi"
    for card in ModelList(data=[ModelCard(id="m", created=1, owned_by="jaxvllm")]).dump()["data"]:
        assert Model.model_validate(card).owned_by == "jaxvllm"


def test_responses_objects_and_events_validate_as_the_sdks_types():
    reply = ('<think>\nhm\n</think>\n\nOK.\n<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n'
             '</tool_call>')
    make = lambda: MessageParser(ReasoningParserManager.get_reasoning_parser("qwen3")(), False,
                                 ToolParserManager.get_tool_parser("hermes")())
    head = dict(id="resp_1", created_at=1, model="m", tools=[], tool_choice="auto",
                parallel_tool_calls=True, store=True, text={"format": {"type": "text"}})
    output = OpenAIServingResponses._items(make().full(reply))
    response = Response.model_validate(OpenAIServingResponses._response(head, output, "stop", 5, 9))
    assert response.output_text == "OK.\n" and [o.type for o in response.output] == [
        "reasoning", "message", "function_call"]
    parser, writer = make(), ItemWriter(itertools.count())
    events = [*writer.feed(parser.feed(reply, final=True)), *writer.close()]
    adapter = pydantic.TypeAdapter(ResponseStreamEvent)
    for text in events:
        kind, data = text.split("\n", 1)
        event = adapter.validate_python(json.loads(data[len("data: "):]))
        assert kind == f"event: {event.type}"
