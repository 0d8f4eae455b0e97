"""Tool-call parsers by name (`--tool-call-parser`), one module per format."""
from jaxvllm.entrypoints.openai.tool_parsers import (  # noqa: F401  (they register themselves)
    hermes_tool_parser,
    llama_tool_parser,
    mistral_tool_parser,
    pythonic_tool_parser,
    qwen3coder_tool_parser,
)
from jaxvllm.entrypoints.openai.tool_parsers.abstract_tool_parser import (  # noqa: F401
    ParsedCall,
    ParsedOutput,
    ToolParser,
    ToolParserManager,
)
