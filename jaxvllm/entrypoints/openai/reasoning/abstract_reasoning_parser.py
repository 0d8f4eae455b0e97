"""What a reasoning parser is: a split of the text generated so far into (reasoning,
content) around `<think>...</think>`, with `--reasoning-parser NAME` choosing the rules.

As with tool parsers, streaming re-splits the text so far on each delta, so a split of a
shorter text must give prefixes of the longer text's parts: an unfinished `</think>` at the
end is held back, and content starts after the whitespace that follows `</think>`.
"""
from __future__ import annotations

from jaxvllm.entrypoints.openai.tool_parsers.abstract_tool_parser import held_back


class ReasoningParser:
    start, end = "<think>", "</think>"
    # Whether a reply with no `<think>` of its own starts inside the reasoning (DeepSeek-R1's
    # template puts `<think>` in the prompt); else only a prompt ending with `<think>` does.
    opens_in_reasoning = False

    def __init__(self, tokenizer=None):
        self.tokenizer = tokenizer

    def starts_in_reasoning(self, prompt_tail: str) -> bool:
        return self.opens_in_reasoning or prompt_tail.rstrip().endswith(self.start)

    def split(self, text: str, final: bool, in_reasoning: bool) -> tuple[str | None, str]:
        """(reasoning or None when the reply has none, content)."""
        body = text.lstrip()
        if body.startswith(self.start):
            text, in_reasoning = body[len(self.start):], True
        elif not final and body and self.start.startswith(body):
            return ("" if in_reasoning else None), ""  # may still become <think>
        elif not in_reasoning:
            return None, text
        at = text.find(self.end)
        if at < 0:
            return text[:len(text) - (0 if final else held_back(text, (self.end,)))], ""
        return text[:at], text[at + len(self.end):].lstrip()


class ReasoningParserManager:
    reasoning_parsers: dict[str, type[ReasoningParser]] = {}

    @classmethod
    def register_module(cls, names: str | list[str]):
        def register(parser_cls: type[ReasoningParser]) -> type[ReasoningParser]:
            for name in [names] if isinstance(names, str) else names:
                cls.reasoning_parsers[name] = parser_cls
            return parser_cls
        return register

    @classmethod
    def get_reasoning_parser(cls, name: str) -> type[ReasoningParser]:
        if name not in cls.reasoning_parsers:
            raise ValueError(f"--reasoning-parser {name!r} is not registered; choose one of "
                             f"{', '.join(sorted(cls.reasoning_parsers))}.")
        return cls.reasoning_parsers[name]
