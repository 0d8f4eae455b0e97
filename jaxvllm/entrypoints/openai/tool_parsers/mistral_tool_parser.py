"""Mistral tool calls, both spellings: `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`
(tokenizers before v11) and `[TOOL_CALLS]name[ARGS]{...}` repeated per call (v11 and
later, optionally `name[CALL_ID]id[ARGS]{...}`). Text before `[TOOL_CALLS]` is content."""
from __future__ import annotations

import json

from jaxvllm.entrypoints.openai.tool_parsers.abstract_tool_parser import (
    JsonCallsParser,
    ParsedCall,
    ParsedOutput,
    ToolParserManager,
    arguments_prefix,
    dumps,
    held_back,
    json_list_calls,
    partial_json,
)

_DECODER = json.JSONDecoder()


@ToolParserManager.register_module("mistral")
class MistralToolParser(JsonCallsParser):
    bot, args_marker, id_marker = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"
    keeps_special_tokens = True  # [TOOL_CALLS] and [ARGS] are special tokens

    def parse(self, text: str, final: bool, tools=None) -> ParsedOutput:
        at = text.find(self.bot)
        if at < 0:
            return ParsedOutput(text if final else text[:len(text) - held_back(text, (self.bot,))])
        out = ParsedOutput(text[:at])
        rest = text[at + len(self.bot):]
        if rest.lstrip().startswith("[") or (not final and not rest.strip()):
            out.calls = json_list_calls(rest.lstrip(), "arguments")
        else:
            for piece in rest.split(self.bot):  # v11: [TOOL_CALLS] may precede every call
                out.calls += self._v11_calls(piece, final)
        return out

    def _v11_calls(self, piece: str, final: bool) -> list[ParsedCall]:
        calls = []
        while self.args_marker in piece:
            name, piece = piece.split(self.args_marker, 1)
            name = name.split(self.id_marker)[0].strip()
            try:
                args, end = _DECODER.raw_decode(piece.lstrip())
            except ValueError:
                parsed = partial_json(piece)
                if name and parsed is not None:
                    calls.append(ParsedCall(name, arguments_prefix(*parsed)))
                return calls
            calls.append(ParsedCall(name, dumps(args), True))
            piece = piece.lstrip()[end:]
        return calls
