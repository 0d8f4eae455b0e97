"""DeepSeek-R1 (and its distills): the reply is reasoning until `</think>`, whether or not
it begins with `<think>` (newer templates put `<think>` in the prompt); a reply cut before
`</think>` is all reasoning."""
from jaxvllm.entrypoints.openai.reasoning.abstract_reasoning_parser import ReasoningParser, ReasoningParserManager


@ReasoningParserManager.register_module("deepseek_r1")
class DeepSeekR1ReasoningParser(ReasoningParser):
    opens_in_reasoning = True
