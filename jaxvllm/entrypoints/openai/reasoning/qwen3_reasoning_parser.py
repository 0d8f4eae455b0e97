"""Qwen3: reasoning only inside `<think>...</think>` that the reply opens itself, or that
the prompt opened (Qwen3-2507 thinking templates); with `enable_thinking: false` the
template closes an empty think block in the prompt and the reply is all content."""
from jaxvllm.entrypoints.openai.reasoning.abstract_reasoning_parser import ReasoningParser, ReasoningParserManager


@ReasoningParserManager.register_module("qwen3")
class Qwen3ReasoningParser(ReasoningParser):
    opens_in_reasoning = False
