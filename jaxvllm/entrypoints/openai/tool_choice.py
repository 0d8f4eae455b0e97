"""A chat request's `tools` and `tool_choice` turned into what the server does with them.

- "none": the template sees the tools, the reply is text.
- "auto": the model decides; the server's `--tool-call-parser` reads calls from the text
  (only with `--enable-auto-tool-choice`, as in vLLM). With a `strict` tool, a call that the
  model begins in the parser's format is held to its function's schema, the text around it
  free (vLLM's structural tags; llguidance's lazy grammar); a parser whose format is not
  declared cannot hold it, and the request is a 400 rather than a `strict` ignored.
- "required" / a named function: the structured-output backend constrains the reply to a
  JSON list of calls (or to the named function's arguments), built from the functions'
  parameter schemas, so it always parses.

Tool definitions are checked before anything runs, each failure a 400 naming the field.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

from jaxvllm.core.json_schema import with_vllm_defaults
from jaxvllm.core.structured_output import grammar_for
from jaxvllm.entrypoints.openai.errors import APIError
from jaxvllm.entrypoints.openai.legacy_guided import CONSTRAINTS
from jaxvllm.entrypoints.openai.strict_schema import strict_schema
from jaxvllm.entrypoints.openai.tool_parsers import ParsedCall, ParsedOutput, ToolParser, ToolParserManager
from jaxvllm.entrypoints.openai.tool_parsers.abstract_tool_parser import json_list_calls
from jaxvllm.sampling_params import StructuredOutputsParams

MAX_TOOLS = 128  # OpenAI's limit
_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
# Constrained calls are written compactly: a small model would otherwise fill its budget
# with the whitespace JSON allows.
_COMPACT = {"x-guidance": {"whitespace_flexible": False}}
AUTO_NEEDS_FLAGS = ('"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser '
                    'to be set on the server.')


class RequiredCallsParser(ToolParser):
    """tool_choice "required": the reply is [{"name": ..., "parameters": {...}}, ...]."""

    def parse(self, text, final, tools=None) -> ParsedOutput:
        return ParsedOutput("", json_list_calls(text, "parameters"))


class NamedCallParser(ToolParser):
    """tool_choice naming a function: the reply is that function's arguments, as written."""

    def __init__(self, name: str):
        super().__init__()
        self.name = name

    def parse(self, text, final, tools=None) -> ParsedOutput:
        return ParsedOutput("", [ParsedCall(self.name, text.lstrip(), final)])


@dataclass
class ToolPlan:
    tools: list[dict] | None = None          # OpenAI's shape, for the template and the parser
    parser: ToolParser | None = None         # reads calls from the reply
    structured_outputs: StructuredOutputsParams | None = None
    max_calls: int | None = None             # parallel_tool_calls: false


def _parameters(tool, i: int) -> dict:
    """The schema the call's arguments are constrained to: as given, or as `strict` makes it."""
    params = tool.function.parameters if tool.function.parameters is not None else {
        "type": "object", "properties": {}}
    return strict_schema(params, f"tools[{i}].function.parameters") if tool.function.strict else params


def check_tools(tools) -> None:
    """Blocking (llguidance compiles each schema): run it off the event loop."""
    if len(tools) > MAX_TOOLS:
        raise APIError(f"tools may hold at most {MAX_TOOLS} functions, got {len(tools)}.", 400, "tools")
    seen = set()
    for i, tool in enumerate(tools):
        name = tool.function.name
        if not _NAME.match(name):
            raise APIError(f"tools[{i}].function.name must be 1-64 letters, digits, '_', '.' or '-'; "
                           f"got {name[:80]!r}.", 400, f"tools[{i}].function.name")
        if name in seen:
            raise APIError(f"tools[{i}].function.name {name!r} is defined twice.", 400,
                           f"tools[{i}].function.name")
        seen.add(name)
        param = f"tools[{i}].function.parameters"
        given = tool.function.parameters or {}
        if given.get("type", "object") != "object":
            raise APIError(f"{param} must be a JSON schema of type object, got type "
                           f"{given.get('type')!r}.", 400, param)
        try:
            params = _parameters(tool, i)
        except ValueError as e:
            raise APIError(str(e), 400, param) from e
        try:
            grammar_for(StructuredOutputsParams(json=params))
        except ValueError as e:
            raise APIError(f"{param} is not a JSON schema this server can use: "
                           f"{str(e).split(': ', 1)[-1][:300]}", 400, param) from e


def _required_schema(tools, parallel: bool) -> dict:
    calls = [{"type": "object", "additionalProperties": False, "required": ["name", "parameters"],
              "properties": {"name": {"const": t.function.name}, "parameters": _parameters(t, i)}}
             for i, t in enumerate(tools)]
    return {"type": "array", "minItems": 1, **({} if parallel else {"maxItems": 1}),
            "items": {"anyOf": calls}, **_COMPACT}


def _strict_calls(tools, parser, parser_name: str, tokenizer) -> StructuredOutputsParams | None:
    """The lazy grammar that holds "auto" calls of strict tools to their schemas (non-strict
    ones to theirs as well, as required and named calls are); None without a strict tool."""
    import llguidance

    strict = next((i for i, t in enumerate(tools) if t.function.strict), None)
    if strict is None:
        return None
    if not parser.call_formats:
        param = f"tools[{strict}].function.strict"
        raise APIError(f"{param}: tool_choice \"auto\" with --tool-call-parser {parser_name} cannot hold a call to "
                       f"its schema; use tool_choice \"required\" or a named function, or strict: false.", 400, param)
    trigger = os.path.commonprefix([opening for opening, _, _ in parser.call_formats])
    tags = [llguidance.StructTag(trigger=trigger, begin=opening + t.function.name + middle,
                                 grammar=with_vllm_defaults({**_parameters(t, i), **_COMPACT}), end=end)
            for i, t in enumerate(tools) for opening, middle, end in parser.call_formats]
    special = tokenizer is not None and trigger in getattr(tokenizer, "all_special_tokens", ())
    return StructuredOutputsParams(grammar=llguidance.StructTag.to_grammar(tags, assume_special=special))


def _refuse_other_constraints(request, choice: str) -> None:
    if (request.structured_outputs is not None or request.response_format is not None
            or any(getattr(request, name, None) is not None for name in CONSTRAINTS)):
        raise APIError(f"response_format, structured_outputs and guided_* cannot be combined with "
                       f"tool_choice {choice}.", 400, "tool_choice")


def plan_tools(request, server_args, tokenizer) -> ToolPlan:
    tools, choice = request.tools or None, request.tool_choice
    if tools is None:
        if choice not in (None, "none"):
            raise APIError("tool_choice needs tools: the request defines none.", 400, "tool_choice")
        return ToolPlan()
    choice = choice or "auto"
    dicts = [t.model_dump(exclude_none=True) for t in tools]
    if choice == "none":
        return ToolPlan(dicts)
    parallel = request.parallel_tool_calls is not False
    max_calls = None if parallel else 1
    if choice == "auto":
        if not (server_args.enable_auto_tool_choice and server_args.tool_call_parser):
            raise APIError(AUTO_NEEDS_FLAGS, 400, "tool_choice")
        parser = ToolParserManager.get_tool_parser(server_args.tool_call_parser)(tokenizer)
        calls = _strict_calls(tools, parser, server_args.tool_call_parser, tokenizer)
        if calls is not None:
            _refuse_other_constraints(request, 'auto with a strict tool')
        return ToolPlan(dicts, parser, calls, max_calls)
    _refuse_other_constraints(request, choice if isinstance(choice, str) else 'naming a function')
    if choice == "required":
        return ToolPlan(dicts, RequiredCallsParser(), StructuredOutputsParams(
            json=_required_schema(tools, parallel)), max_calls)
    name = choice.function.name
    i = next((i for i, t in enumerate(tools) if t.function.name == name), None)
    if i is None:
        raise APIError(f"tool_choice.function.name {name!r} is not one of the request's tools.",
                       400, "tool_choice.function.name")
    return ToolPlan(dicts, NamedCallParser(name),
                    StructuredOutputsParams(json={**_parameters(tools[i], i), **_COMPACT}))
