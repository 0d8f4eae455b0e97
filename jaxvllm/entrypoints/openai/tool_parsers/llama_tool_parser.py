"""Llama 3.1 / 3.2 JSON tool calls (`llama3_json`): the whole reply is
`{"name": ..., "parameters": {...}}`, optionally after `<|python_tag|>`, several calls
separated by `;`. A reply that starts otherwise is plain content."""
from __future__ import annotations

import json

from jaxvllm.entrypoints.openai.tool_parsers.abstract_tool_parser import (
    JsonCallsParser,
    ParsedOutput,
    ToolParserManager,
)

_DECODER = json.JSONDecoder()


@ToolParserManager.register_module("llama3_json")
class Llama3JsonToolParser(JsonCallsParser):
    tag = "<|python_tag|>"
    keeps_special_tokens = True

    def parse(self, text: str, final: bool, tools=None) -> ParsedOutput:
        body = text.lstrip()
        if body.startswith(self.tag):
            body = body[len(self.tag):]
        elif not body.startswith("{"):
            undecided = not final and (not body or self.tag.startswith(body))
            return ParsedOutput("" if undecided else text)
        out, pos = ParsedOutput(), 0
        while True:
            while pos < len(body) and body[pos] in " \t\r\n;":
                pos += 1
            if pos == len(body):
                return out
            try:
                value, end = _DECODER.raw_decode(body, pos)
            except ValueError:  # the call still being written (or not JSON: no more calls)
                call = self.call_from_json(body[pos:])
                if call is not None:
                    out.calls.append(call)
                return out if out.calls or not final else ParsedOutput(text)
            call = self.call_from_json(body[pos:end])
            if call is None:
                return out if out.calls else ParsedOutput(text if final else "")
            out.calls.append(call)
            pos = end
