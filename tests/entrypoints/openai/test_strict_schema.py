"""OpenAI's `strict`: every object closed and every property required, at any depth; what
strict mode cannot express refused by keyword and place, never loosened. The server's 400s
for it (chat tools, response_format, Responses) are in test_openai_tools_bad_inputs.py."""
from __future__ import annotations

import json
import re

import pytest

from jaxvllm.entrypoints.openai.strict_schema import UNSUPPORTED, strict_schema

FIELD = "tools[0].function.parameters"
WEATHER = {"type": "object", "properties": {"city": {"type": "string"},
                                            "unit": {"type": "string", "enum": ["c", "f"]}}}


def test_objects_are_closed_and_every_property_required_at_any_depth():
    schema = {"type": "object", "$defs": {"place": {"type": "object", "properties": {"lat": {"type": "number"}}}},
              "properties": {"where": {"$ref": "#/$defs/place"},
                             "days": {"type": "array", "items": {"anyOf": [
                                 {"type": "object", "properties": {"d": {"type": "integer"}}}, {"type": "null"}]}},
                             "meta": {"type": ["object", "null"]}},
              "required": ["where"]}
    before = json.dumps(schema)
    out = strict_schema(schema, FIELD)
    assert json.dumps(schema) == before  # the request's schema is left as sent
    assert out["required"] == ["where", "days", "meta"] and out["additionalProperties"] is False
    place, day = out["$defs"]["place"], out["properties"]["days"]["items"]["anyOf"][0]
    assert place == {"type": "object", "properties": {"lat": {"type": "number"}}, "additionalProperties": False,
                     "required": ["lat"]}
    assert day["required"] == ["d"] and day["additionalProperties"] is False
    assert out["properties"]["meta"] == {"type": ["object", "null"], "additionalProperties": False, "required": []}


@pytest.mark.parametrize("keyword", UNSUPPORTED)
def test_what_strict_mode_cannot_express_is_refused_by_name_and_place(keyword):
    schema = {**WEATHER, "properties": {**WEATHER["properties"], "extra": {"type": "object", keyword: {}}}}
    with pytest.raises(ValueError, match=rf"^{re.escape(FIELD)}: strict mode does not support '{keyword}' "
                                         r"\(at properties.extra\)"):
        strict_schema(schema, FIELD)


@pytest.mark.parametrize("value", [True, {"type": "string"}])
def test_an_open_object_is_refused(value):
    with pytest.raises(ValueError, match=r"needs 'additionalProperties' to be false \(at the root\)"):
        strict_schema({**WEATHER, "additionalProperties": value}, FIELD)


@pytest.mark.parametrize("schema,match", [
    ({"type": "array", "items": WEATHER}, "a schema of type object at the root"),
    ({"anyOf": [WEATHER]}, "a schema of type object at the root"),
    ({**WEATHER, "required": ["city", "country"]}, "'required' names 'country', which 'properties' does not"),
])
def test_schemas_strict_mode_cannot_hold_are_refused(schema, match):
    with pytest.raises(ValueError, match=match):
        strict_schema(schema, FIELD)


def test_auto_holds_a_strict_tools_calls_to_its_schema_and_leaves_text_free():
    """tool_choice "auto" with a strict tool and the hermes parser: text stays free, and a call
    the model begins in hermes' format is held to the closed, all-required schema (vLLM's
    structural tag); a parser whose format is not declared is a 400 naming the tool's strict."""
    import llguidance
    import llguidance.hf

    from jaxvllm.core.structured_output import grammar_for
    from jaxvllm.entrypoints.openai.errors import APIError
    from jaxvllm.entrypoints.openai.protocol import ChatCompletionRequest
    from jaxvllm.entrypoints.openai.server_args import ServerArgs
    from jaxvllm.entrypoints.openai.tool_choice import plan_tools
    from jaxvllm.transformers_utils.model_path import default_model_path
    from jaxvllm.transformers_utils.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(default_model_path())
    request = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], "tools": [
        {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER, "strict": True}}]})
    plan = plan_tools(request, ServerArgs(enable_auto_tool_choice=True, tool_call_parser="hermes"), tokenizer)
    ll, grammar = llguidance.hf.from_tokenizer(tokenizer), grammar_for(plan.structured_outputs)

    def accepts(text: str) -> bool:
        matcher = llguidance.LLMatcher(ll, grammar, log_level=0)
        tokens = tokenizer.encode(text, add_special_tokens=False)
        return matcher.try_consume_tokens(tokens) == len(tokens) and matcher.is_accepting()

    call = '<tool_call>\n{"name": "get_weather", "arguments": %s}\n</tool_call>'
    assert accepts("It is sunny, I think.")
    assert accepts("Let me look. " + call % '{"city":"Paris","unit":"c"}')
    assert not accepts(call % '{"city":"Paris"}')  # strict: every property required
    assert not accepts(call % '{"city":"Paris","unit":"c","x":1}')  # and no other
    assert not accepts(call.replace("get_weather", "get_time") % "{}")  # only the request's functions
    with pytest.raises(APIError, match=r"tools\[0\].function.strict: tool_choice \"auto\" with --tool-call-parser "
                                       r"llama3_json cannot hold"):
        plan_tools(request, ServerArgs(enable_auto_tool_choice=True, tool_call_parser="llama3_json"), tokenizer)
