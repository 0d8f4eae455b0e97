"""Python-call lists (`pythonic`: Llama 3.2 / 4, ToolACE): the reply is
`[get_weather(city="Paris", days=3), get_time()]`, optionally inside
`<|python_start|>...<|python_end|>`; argument values are Python literals. A reply that
does not start with `[` is content.

While the list is being written it is cut after its last whole keyword argument (or call)
and closed, so a call's name appears once its `(` is there and its arguments grow one
whole value at a time."""
from __future__ import annotations

import ast

from jaxvllm.entrypoints.openai.tool_parsers.abstract_tool_parser import (
    ParsedCall,
    ParsedOutput,
    ToolParser,
    ToolParserManager,
    dumps,
)

_OPEN, _CLOSE = "([{", ")]}"


def _last_cut(text: str) -> tuple[int, str] | None:
    """The end of the longest prefix that closes into a list of calls, and its closers."""
    depth, quote, escaped, cut = 0, None, False, None
    for i, c in enumerate(text):
        if quote:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == quote:
                quote = None
        elif c in "'\"":
            quote = c
        elif c in _OPEN:
            depth += 1
            if c == "(" and depth == 2:
                cut = (i + 1, ")]")
        elif c in _CLOSE:
            depth -= 1
            if c == ")" and depth == 1:
                cut = (i + 1, "]")
        elif c == "," and depth == 2:
            cut = (i, ")]")
    return cut


def _calls(source: str) -> list[tuple[str, dict]] | None:
    try:
        tree = ast.parse(source.strip(), mode="eval").body
        if not isinstance(tree, ast.List):
            return None
        calls = []
        for node in tree.elts:
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)) or node.args:
                return None
            calls.append((node.func.id, {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords}))
        return calls
    except (SyntaxError, ValueError, TypeError, RecursionError, MemoryError):
        return None


@ToolParserManager.register_module("pythonic")
class PythonicToolParser(ToolParser):
    start, end = "<|python_start|>", "<|python_end|>"

    def parse(self, text: str, final: bool, tools=None) -> ParsedOutput:
        body = text.strip()
        if body.startswith(self.start):
            body = body[len(self.start):].replace(self.end, "").strip()
        elif not body.startswith("["):
            undecided = not final and (not body or self.start.startswith(body))
            return ParsedOutput("" if undecided else text)
        if final:
            calls = _calls(body)
            if calls is None:
                return ParsedOutput(text)
            return ParsedOutput("", [ParsedCall(n, dumps(a), True) for n, a in calls])
        cut = _last_cut(body)
        calls = _calls(body[:cut[0]] + cut[1]) if cut else None
        if not calls:
            return ParsedOutput()
        out = [ParsedCall(n, dumps(a), True) for n, a in calls]
        if cut[1] == ")]":  # the last call is still open: its arguments may grow
            out[-1] = ParsedCall(out[-1].name, out[-1].arguments.rstrip("]}"))
        return ParsedOutput("", out)
