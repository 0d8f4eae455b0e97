"""Reasoning parsers by name (`--reasoning-parser`), one module per model family."""
from jaxvllm.entrypoints.openai.reasoning import deepseek_r1_reasoning_parser, qwen3_reasoning_parser  # noqa: F401  (they register themselves)
from jaxvllm.entrypoints.openai.reasoning.abstract_reasoning_parser import ReasoningParser, ReasoningParserManager  # noqa: F401
