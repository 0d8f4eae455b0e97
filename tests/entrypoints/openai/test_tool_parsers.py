"""Every tool and reasoning parser against replies written in its format as the format's
documentation shows them: the whole text parsed at once, and the text streamed one
character at a time and in two pieces split at every character, give the same calls,
content and reasoning."""
from __future__ import annotations

import json

import pytest

from jaxvllm.entrypoints.openai.message_parser import MessageParser
from jaxvllm.entrypoints.openai.reasoning import ReasoningParserManager
from jaxvllm.entrypoints.openai.tool_parsers import ToolParserManager

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                     "metric": {"type": "boolean"}, "hours": {"type": "array"}}}}}

# (parser, reply, expected content, expected [(name, arguments as parsed JSON)])
RECORDED = [
    ("hermes",  # Qwen2.5 / Hermes function-calling docs: one block per call
     'Let me check both.\n<tool_call>\n{"name": "get_current_temperature", "arguments": '
     '{"location": "San Francisco, CA, USA", "unit": "celsius"}}\n</tool_call>\n<tool_call>\n'
     '{"name": "get_temperature_date", "arguments": {"location": "San Francisco, CA, USA", '
     '"date": "2024-10-01", "unit": "celsius"}}\n</tool_call>',
     "Let me check both.\n",
     [("get_current_temperature", {"location": "San Francisco, CA, USA", "unit": "celsius"}),
      ("get_temperature_date", {"location": "San Francisco, CA, USA", "date": "2024-10-01",
                                "unit": "celsius"})]),
    ("hermes", 'No tools needed: 2 < 3 and {"a": 1} is JSON.', 'No tools needed: 2 < 3 and {"a": 1} is JSON.', []),
    ("hermes", '<tool_call>\n{"name": "write", "arguments": {"text": "a \\"quoted\\" }] line\\nnext", '
     '"n": [1, 2.5, {"deep": null}], "ok": true}}\n</tool_call>', None,
     [("write", {"text": 'a "quoted" }] line\nnext', "n": [1, 2.5, {"deep": None}], "ok": True})]),
    ("llama3_json",  # Meta's Llama 3.1 JSON-based tool calling
     '{"name": "get_current_conditions", "parameters": {"location": "San Francisco, CA", '
     '"unit": "Fahrenheit"}}', None,
     [("get_current_conditions", {"location": "San Francisco, CA", "unit": "Fahrenheit"})]),
    ("llama3_json",
     '<|python_tag|>{"name": "a", "parameters": {"x": 1}}; {"name": "b", "parameters": {}}', None,
     [("a", {"x": 1}), ("b", {})]),
    ("llama3_json", "The weather is fine.", "The weather is fine.", []),
    ("mistral",  # Mistral's function-calling docs (tokenizer v3)
     '[TOOL_CALLS] [{"name": "get_current_weather", "arguments": {"location": "Paris, France", '
     '"format": "celsius"}}, {"name": "get_time", "arguments": {}}]', None,
     [("get_current_weather", {"location": "Paris, France", "format": "celsius"}),
      ("get_time", {})]),
    ("mistral",  # tokenizer v11+: name[ARGS]{...} per call
     'Sure.[TOOL_CALLS]get_current_weather[ARGS]{"location": "Paris", "format": "celsius"}'
     '[TOOL_CALLS]get_time[ARGS]{}', "Sure.",
     [("get_current_weather", {"location": "Paris", "format": "celsius"}), ("get_time", {})]),
    ("pythonic",  # Llama 3.2 / 4 python-list format
     '[get_weather(city="San Francisco", metric=True, hours=[1, 2]), get_user_info(user_id=7890, '
     "special='black, (really)')]", None,
     [("get_weather", {"city": "San Francisco", "metric": True, "hours": [1, 2]}),
      ("get_user_info", {"user_id": 7890, "special": "black, (really)"})]),
    ("pythonic", "[1] is a citation, not a call.", "[1] is a citation, not a call.", []),
    ("pythonic", "<|python_start|>[get_time()]<|python_end|>", None, [("get_time", {})]),
    ("qwen3_coder",  # Qwen3-Coder's XML format
     "I'll look.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Francisco\n</parameter>\n"
     "<parameter=days>\n3\n</parameter>\n<parameter=metric>\ntrue\n</parameter>\n<parameter=hours>\n"
     "[1, 2]\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_time>\n</function>\n"
     "</tool_call>", "I'll look.\n",
     [("get_weather", {"city": "San Francisco", "days": 3, "metric": True, "hours": [1, 2]}),
      ("get_time", {})]),
]

REASONING = [
    ("deepseek_r1", False, "<think>\nThe user wants 6*7. That is 42.\n</think>\n\nThe answer is 42.",
     "\nThe user wants 6*7. That is 42.\n", "The answer is 42."),
    ("deepseek_r1", False, "Prompt opened <think>; 6*7=42.</think>42.", "Prompt opened <think>; 6*7=42.", "42."),
    ("deepseek_r1", False, "Still thinking when cut off", "Still thinking when cut off", None),
    ("qwen3", False, "<think>\nShort.\n</think>\n\nHello!", "\nShort.\n", "Hello!"),
    ("qwen3", False, "Hello without thinking. </think> is text here", None,
     "Hello without thinking. </think> is text here"),
    ("qwen3", True, "Opened by the prompt.\n</think>\n\nHi", "Opened by the prompt.\n", "Hi"),
]


def _streamed(parser: MessageParser, pieces: list[str]):
    reasoning, content, calls = "", "", {}
    for i, piece in enumerate(pieces):
        delta = parser.feed(piece, final=i == len(pieces) - 1)
        reasoning += delta.reasoning
        content += delta.content
        for tc in delta.tool_calls:
            if "id" in tc:
                assert tc["index"] == len(calls) and tc["type"] == "function"
                calls[tc["index"]] = [tc["function"]["name"], ""]
            calls[tc["index"]][1] += tc["function"]["arguments"]
    return reasoning or None, content or None, [tuple(c) for c in calls.values()]


def _splits(text: str):
    yield [*text, ""]  # one character per delta
    for k in range(len(text) + 1):
        yield [text[:k], text[k:]]


@pytest.mark.parametrize("name,reply,content,calls", RECORDED)
def test_tool_parser_streamed_and_whole_agree(name, reply, content, calls):
    make = lambda: MessageParser(tool_parser=ToolParserManager.get_tool_parser(name)(),
                                 tools=[WEATHER])
    whole = make().full(reply)
    assert whole.content == content
    got = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in whole.tool_calls]
    assert got == calls
    expected = [(c["function"]["name"], c["function"]["arguments"]) for c in whole.tool_calls]
    for pieces in _splits(reply):
        _, streamed_content, streamed_calls = _streamed(make(), pieces)
        assert streamed_calls == expected, pieces
        assert (streamed_content or None) == (content or None), pieces


@pytest.mark.parametrize("name,prompt_opened,reply,reasoning,content", REASONING)
def test_reasoning_parser_streamed_and_whole_agree(name, prompt_opened, reply, reasoning, content):
    parser = ReasoningParserManager.get_reasoning_parser(name)()
    opened = parser.starts_in_reasoning("<|im_start|>assistant\n<think>\n" if prompt_opened else "")
    whole = MessageParser(parser, opened).full(reply)
    assert (whole.reasoning, whole.content) == (reasoning, content)
    for pieces in _splits(reply):
        streamed = _streamed(MessageParser(parser, opened), pieces)
        assert streamed[:2] == (reasoning, content), pieces


def test_tool_calls_are_read_from_the_content_after_reasoning():
    reply = ('<think>I could write <tool_call>{"name": "no"}</tool_call> here.</think>\n'
             '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')
    make = lambda: MessageParser(ReasoningParserManager.get_reasoning_parser("qwen3")(), False,
                                 ToolParserManager.get_tool_parser("hermes")())
    whole = make().full(reply)
    assert whole.reasoning.startswith("I could write <tool_call>")
    assert [c["function"]["name"] for c in whole.tool_calls] == ["get_time"]
    for pieces in _splits(reply):
        assert _streamed(make(), pieces)[2] == [("get_time", "{}")]


def test_plugin_parser_is_loaded_from_a_file(tmp_path):
    plugin = tmp_path / "my_parser.py"
    plugin.write_text(
        "from jaxvllm.entrypoints.openai.tool_parsers import ParsedCall, ParsedOutput, ToolParser, "
        "ToolParserManager\n\n"
        "@ToolParserManager.register_module('shout')\n"
        "class Shout(ToolParser):\n"
        "    def parse(self, text, final, tools=None):\n"
        "        if text.startswith('CALL '):\n"
        "            return ParsedOutput('', [ParsedCall(text[5:].strip(), '{}', True)]) if final else ParsedOutput()\n"
        "        return ParsedOutput(text)\n")
    ToolParserManager.import_tool_parser(str(plugin))
    parser = MessageParser(tool_parser=ToolParserManager.get_tool_parser("shout")())
    assert parser.full("CALL ping").tool_calls[0]["function"] == {"name": "ping", "arguments": "{}"}
    with pytest.raises(ValueError, match="--tool-call-parser 'nope' is not registered"):
        ToolParserManager.get_tool_parser("nope")


def test_server_flags_are_checked_at_start_up():
    from jaxvllm.entrypoints.openai.server_args import ServerArgs
    with pytest.raises(ValueError, match="--enable-auto-tool-choice needs --tool-call-parser"):
        ServerArgs(enable_auto_tool_choice=True)
    with pytest.raises(ValueError, match="'xml9' is not registered; choose one of hermes, llama3_json"):
        ServerArgs(enable_auto_tool_choice=True, tool_call_parser="xml9")
    with pytest.raises(ValueError, match="--reasoning-parser 'o1' is not registered"):
        ServerArgs(reasoning_parser="o1")
    assert ServerArgs(enable_auto_tool_choice=True, tool_call_parser="qwen3_coder",
                      reasoning_parser="deepseek_r1").tool_call_parser == "qwen3_coder"
