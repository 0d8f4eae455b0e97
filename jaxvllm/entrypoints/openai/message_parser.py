"""One choice's generated text as an assistant message: reasoning, content and tool calls.

The reasoning parser splits the text first and the tool parser reads the content part only.
Streaming parses the whole text so far on every delta (parsers are functions of the text,
see tool_parsers/abstract_tool_parser.py) and sends what grew: a call's id, type and name
once, then its argument fragments, as OpenAI streams them. Content that is only whitespace
so far is held, so a reply that is just calls streams no stray newlines. A long reply is
parsed again only once it has grown by 1/64 of its length (partial JSON is parsed in
Python: a call writing a file must not cost the event loop quadratic time).
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from jaxvllm.entrypoints.openai.reasoning import ReasoningParser
from jaxvllm.entrypoints.openai.tool_parsers import ParsedCall, ToolParser


def tool_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class MessageDelta:
    reasoning: str = ""
    content: str = ""
    # OpenAI's delta shape: {"index", "id"?, "type"?, "function": {"name"?, "arguments"}}
    tool_calls: list[dict] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content or self.tool_calls)


@dataclass
class ParsedMessage:
    reasoning: str | None
    content: str | None
    tool_calls: list[dict]  # OpenAI's {"id", "type": "function", "function": {"name", "arguments"}}


class MessageParser:
    def __init__(self, reasoning_parser: ReasoningParser | None = None, in_reasoning: bool = False,
                 tool_parser: ToolParser | None = None, tools: list[dict] | None = None,
                 max_calls: int | None = None):
        self.reasoning_parser = reasoning_parser
        self.in_reasoning = in_reasoning
        self.tool_parser = tool_parser
        self.tools = tools
        self.max_calls = max_calls  # parallel_tool_calls: false -> 1
        self.text = ""
        self._sent_reasoning = 0
        self._sent_content = 0
        self._sent_calls: list[list] = []  # [id, arguments sent so far]
        self._parsed = 0  # length of the text last parsed

    def parse(self, text: str, final: bool) -> tuple[str | None, str, list[ParsedCall]]:
        reasoning, content = None, text
        if self.reasoning_parser is not None:
            reasoning, content = self.reasoning_parser.split(text, final, self.in_reasoning)
        if self.tool_parser is None:
            return reasoning, content, []
        out = self.tool_parser.parse(content, final, self.tools)
        return reasoning, out.content, out.calls[:self.max_calls]

    def full(self, text: str) -> ParsedMessage:
        reasoning, content, calls = self.parse(text, final=True)
        if not content.strip():
            content = None if calls or reasoning is not None else content
        return ParsedMessage(reasoning, content, [
            {"id": tool_call_id(), "type": "function",
             "function": {"name": c.name, "arguments": c.arguments}} for c in calls])

    def feed(self, delta: str, final: bool = False) -> MessageDelta:
        self.text += delta
        if not final and len(self.text) - self._parsed < len(self.text) // 64:
            return MessageDelta()
        self._parsed = len(self.text)
        reasoning, content, calls = self.parse(self.text, final)
        out = MessageDelta()
        if reasoning and len(reasoning) > self._sent_reasoning:
            out.reasoning = reasoning[self._sent_reasoning:]
            self._sent_reasoning = len(reasoning)
        if content.strip() and len(content) > self._sent_content:
            out.content = content[self._sent_content:]
            self._sent_content = len(content)
        for i, call in enumerate(calls):
            if i == len(self._sent_calls):
                self._sent_calls.append([tool_call_id(), ""])
                out.tool_calls.append({"index": i, "id": self._sent_calls[i][0], "type": "function",
                                       "function": {"name": call.name, "arguments": ""}})
            sent = self._sent_calls[i][1]
            if len(call.arguments) > len(sent) and call.arguments.startswith(sent):
                fragment = call.arguments[len(sent):]
                self._sent_calls[i][1] = call.arguments
                if out.tool_calls and out.tool_calls[-1]["index"] == i:
                    out.tool_calls[-1]["function"]["arguments"] += fragment
                else:
                    out.tool_calls.append({"index": i, "function": {"arguments": fragment}})
        return out

    @property
    def called_tools(self) -> bool:
        return bool(self._sent_calls)
