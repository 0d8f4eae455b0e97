"""Qwen3-Coder's XML tool calls (`qwen3_coder`):

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

Values are raw text, typed by the request's tool schema (integer, number, boolean, object,
array; anything else stays a string). A parameter joins the arguments once it is closed."""
from __future__ import annotations

import ast
import json
import re

from jaxvllm.entrypoints.openai.tool_parsers.abstract_tool_parser import (
    ParsedCall,
    ParsedOutput,
    ToolParser,
    ToolParserManager,
    dumps,
    held_back,
)

_FUNCTION = re.compile(r"<function=([^>\n]+)>")
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)(?:</parameter>|(?=<parameter=)|(?=</function>))",
                        re.DOTALL)


def _typed(value: str, schema: dict | None):
    kind = (schema or {}).get("type")
    kind = next((k for k in kind if k != "null"), None) if isinstance(kind, list) else kind
    if value.lower() == "null" and kind != "string":
        return None
    try:
        if kind == "integer":
            return int(value)
        if kind == "number":
            number = float(value)
            return int(number) if number.is_integer() and "." not in value else number
        if kind == "boolean":
            return {"true": True, "false": False}[value.lower()]
        if kind in ("object", "array"):
            try:
                return json.loads(value)
            except ValueError:
                return ast.literal_eval(value)
    except (ValueError, KeyError, SyntaxError):
        pass
    return value


def _schemas(tools: list[dict] | None, name: str) -> dict:
    for tool in tools or []:
        function = tool.get("function") or {}
        if function.get("name") == name:
            return (function.get("parameters") or {}).get("properties") or {}
    return {}


@ToolParserManager.register_module("qwen3_coder")
class Qwen3CoderToolParser(ToolParser):
    start, end = "<tool_call>", "</tool_call>"
    keeps_special_tokens = True

    def parse(self, text: str, final: bool, tools=None) -> ParsedOutput:
        at = text.find(self.start)
        if at < 0:
            return ParsedOutput(text if final else text[:len(text) - held_back(text, (self.start,))])
        out = ParsedOutput(text[:at])
        for block in text[at:].split(self.start)[1:]:
            block = block.split(self.end)[0]
            match = _FUNCTION.search(block)
            if match is None:
                continue
            name = match.group(1).strip()
            body = block[match.end():]
            done = "</function>" in body or final
            body = body.split("</function>")[0]
            props = _schemas(tools, name)
            args = {p.group(1).strip(): _typed(p.group(2).strip("\n"), props.get(p.group(1).strip()))
                    for p in _PARAMETER.finditer(body)}
            text_args = dumps(args)
            out.calls.append(ParsedCall(name, text_args if done else text_args.rstrip("]}"), done))
        return out
