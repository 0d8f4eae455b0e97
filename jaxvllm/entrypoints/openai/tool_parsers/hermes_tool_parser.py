"""Hermes (NousResearch Hermes 2 Pro / 3, Qwen 2.5 and Qwen3's instruct models):
`<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`, one block per call, after
optional text (which is the content)."""
from __future__ import annotations

from jaxvllm.entrypoints.openai.tool_parsers.abstract_tool_parser import (
    JsonCallsParser,
    ParsedOutput,
    ToolParserManager,
    held_back,
)


@ToolParserManager.register_module("hermes")
class HermesToolParser(JsonCallsParser):
    start, end = "<tool_call>", "</tool_call>"
    keeps_special_tokens = True  # Qwen's <tool_call> is a special token
    call_formats = (('<tool_call>\n{"name": "', '", "arguments": ', '}\n</tool_call>'),
                    ('<tool_call>{"name": "', '", "arguments": ', '}</tool_call>'))

    def parse(self, text: str, final: bool, tools=None) -> ParsedOutput:
        at = text.find(self.start)
        if at < 0:
            return ParsedOutput(text if final else text[:len(text) - held_back(text, (self.start,))])
        out = ParsedOutput(text[:at])
        while at >= 0:
            body_at = at + len(self.start)
            end_at = text.find(self.end, body_at)
            if end_at < 0:
                body = text[body_at:]
                body = body[:len(body) - held_back(body, (self.end,))]
            else:
                body = text[body_at:end_at]
            call = self.call_from_json(body)
            if call is not None and (call.done or end_at < 0):
                out.calls.append(call)
            if end_at < 0:
                break
            at = text.find(self.start, end_at + len(self.end))
        return out
