"""Reasoning parsers by name (`--reasoning-parser`), one module per model family."""
from jaxvllm.entrypoints.openai.reasoning.abstract_reasoning_parser import (  # noqa: F401
    ReasoningParser, ReasoningParserManager)
from jaxvllm.entrypoints.openai.reasoning import (  # noqa: F401  (they register themselves)
    deepseek_r1_reasoning_parser, qwen3_reasoning_parser)
