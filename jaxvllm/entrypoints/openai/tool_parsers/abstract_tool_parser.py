"""What a tool parser is: a function from the text generated so far to (content, calls).

Each format (hermes, llama3_json, ...) only says how to find its calls in a text, finished
or not; streaming is derived from that one function (tool_stream.py): the text so far is
parsed again on every delta and only what grew is sent. A parser therefore promises that
the content and each call's arguments of a shorter text are prefixes of those of a longer
one, and that a call's name appears only once it is whole. Arguments are JSON text in
json.dumps's spelling, so streamed fragments add up to exactly the non-streamed string.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from partial_json_parser import Allow, MalformedJSON, loads

# Containers may be open; leaves only whole (a number "12" may still become "123").
_WHOLE_LEAVES = Allow.OBJ | Allow.ARR
_WITH_OPEN_STRING = _WHOLE_LEAVES | Allow.STR


@dataclass
class ParsedCall:
    name: str
    arguments: str  # JSON text; a prefix of the final text until `done`
    done: bool = False


@dataclass
class ParsedOutput:
    content: str = ""  # the text that is not a call (what may be shown so far)
    calls: list[ParsedCall] = field(default_factory=list)


def partial_json(text: str) -> tuple[Any, Any] | None:
    """An unfinished JSON text read twice with partial-json-parser: with whole leaves only,
    and with a trailing unfinished string kept. None if nothing parses yet."""
    text = text.strip()
    if not text:
        return None
    try:
        return loads(text, _WHOLE_LEAVES), loads(text, _WITH_OPEN_STRING)
    except (MalformedJSON, ValueError, IndexError, RecursionError):
        return None


def complete_json(text: str) -> tuple[bool, Any]:
    """(True, value) when `text` is one whole JSON value, else (False, None)."""
    try:
        return True, json.loads(text)
    except (ValueError, RecursionError):
        return False, None


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def arguments_prefix(whole: Any, with_open_string: Any) -> str:
    """The part of json.dumps(final value) that an unfinished value already fixes: its
    serialization without the brackets the partial parser closed (and without the closing
    quote of a string still being written). json.dumps writes each key and character on its
    own, so what remains is a prefix of the final text."""
    text = dumps(with_open_string).rstrip("]}")
    if with_open_string != whole:  # the last leaf is an unfinished string
        text = text[:-1]
    return text


def held_back(text: str, markers: tuple[str, ...]) -> int:
    """How many trailing characters of `text` could be the start of a marker (and so must
    not be shown as content yet)."""
    best = 0
    for marker in markers:
        for n in range(min(len(marker) - 1, len(text)), best, -1):
            if text.endswith(marker[:n]):
                best = n
                break
    return best


class ToolParser:
    """One model family's tool-call format. `tools` are the request's (dicts, OpenAI's
    shape), for formats whose values need the parameters' types."""

    # Special tokens the format uses: kept in the text for the parser (vLLM's adjust_request).
    keeps_special_tokens = False
    # How a call is written, for strict tools under tool_choice "auto" (tool_choice.py):
    # (text before the function's name, between the name and its arguments, after them);
    # each opening must start with the same trigger. Empty: the format is not constrained.
    call_formats: tuple[tuple[str, str, str], ...] = ()

    def __init__(self, tokenizer=None):
        self.tokenizer = tokenizer

    def parse(self, text: str, final: bool, tools: list[dict] | None = None) -> ParsedOutput:
        raise NotImplementedError


class JsonCallsParser(ToolParser):
    """Formats whose calls are JSON objects {name_key: ..., args_key: {...}}; a subclass
    says where each call's JSON text is."""
    name_key = "name"
    args_keys: tuple[str, ...] = ("arguments", "parameters")

    def call_from_json(self, text: str) -> ParsedCall | None:
        ok, value = complete_json(text.strip())
        if ok:
            if not isinstance(value, dict) or not isinstance(value.get(self.name_key), str):
                return None
            args = next((value[k] for k in self.args_keys if k in value), {})
            return ParsedCall(value[self.name_key], dumps(args), True)
        parsed = partial_json(text)
        if parsed is None or not isinstance(parsed[0], dict):
            return None
        whole, with_str = parsed
        name = whole.get(self.name_key)
        if not isinstance(name, str):
            return None
        key = next((k for k in self.args_keys if k in whole), None)
        if key is None:
            return ParsedCall(name, "")
        return ParsedCall(name, arguments_prefix(whole[key], with_str[key]))


class ToolParserManager:
    """Parsers by name (`--tool-call-parser NAME`); `--tool-parser-plugin FILE` imports a
    file whose parsers register themselves with `@ToolParserManager.register_module(...)`,
    as in vLLM."""
    tool_parsers: dict[str, type[ToolParser]] = {}

    @classmethod
    def register_module(cls, names: str | list[str]):
        def register(parser_cls: type[ToolParser]) -> type[ToolParser]:
            for name in [names] if isinstance(names, str) else names:
                cls.tool_parsers[name] = parser_cls
            return parser_cls
        return register

    @classmethod
    def get_tool_parser(cls, name: str) -> type[ToolParser]:
        if name not in cls.tool_parsers:
            raise ValueError(f"--tool-call-parser {name!r} is not registered; choose one of "
                             f"{', '.join(sorted(cls.tool_parsers))} (or load yours with "
                             f"--tool-parser-plugin).")
        return cls.tool_parsers[name]

    @classmethod
    def import_tool_parser(cls, path: str) -> None:
        import importlib.util
        import os
        import sys

        if not os.path.isfile(path):
            raise ValueError(f"--tool-parser-plugin {path!r} is not a file.")
        name = os.path.splitext(os.path.basename(path))[0]
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)


def json_list_calls(text: str, args_key: str) -> list[ParsedCall]:
    """Calls from a (possibly unfinished) JSON list [{"name": ..., args_key: {...}}, ...];
    all are done once the list is whole."""
    ok, value = complete_json(text.strip())
    if ok:
        if not isinstance(value, list):
            return []
        return [ParsedCall(v["name"], dumps(v.get(args_key, {})), True) for v in value
                if isinstance(v, dict) and isinstance(v.get("name"), str)]
    parsed = partial_json(text)
    if parsed is None or not isinstance(parsed[0], list):
        return []
    return [ParsedCall(whole["name"], arguments_prefix(whole.get(args_key, {}),
                                                       with_str.get(args_key, {})))
            for whole, with_str in zip(*parsed)
            if isinstance(whole, dict) and isinstance(whole.get("name"), str)]
