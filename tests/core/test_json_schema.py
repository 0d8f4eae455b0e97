"""The defaults JSON schemas get here, as vLLM's default grammar backend (xgrammar, strict
mode) gives them: an object that declares its properties admits no other key, an array of
prefixItems no other item, and whitespace between tokens is bounded; checked on the
grammar llguidance compiles, with the default model's tokenizer."""
from __future__ import annotations

import json

import llguidance
import llguidance.hf
import pytest

from jaxvllm.core.json_schema import MAX_JSON_WHITESPACE, with_vllm_defaults
from jaxvllm.core.structured_output import grammar_for
from jaxvllm.sampling_params import StructuredOutputsParams
from jaxvllm.transformers_utils.model_path import default_model_path
from jaxvllm.transformers_utils.tokenizer import load_tokenizer

CITY = {"type": "object", "properties": {"city": {"type": "string"}}}


@pytest.fixture(scope="module")
def accepts():
    tokenizer = load_tokenizer(default_model_path())
    ll = llguidance.hf.from_tokenizer(tokenizer)

    def accepts(schema, text: str) -> bool:
        matcher = llguidance.LLMatcher(ll, grammar_for(StructuredOutputsParams(json=schema)), log_level=0)
        tokens = tokenizer.encode(text, add_special_tokens=False)
        return matcher.try_consume_tokens(tokens) == len(tokens) and matcher.is_accepting()
    return accepts


@pytest.mark.parametrize("schema,text,ok", [
    (CITY, '{"city": "Paris"}', True),
    (CITY, '{"city": "Paris", "unit": "c"}', False),  # undeclared: closed, as xgrammar's strict mode
    ({**CITY, "additionalProperties": True}, '{"city": "Paris", "unit": "c"}', True),  # as written
    ({**CITY, "additionalProperties": {"type": "integer"}}, '{"city": "P", "n": 1}', True),
    ({"type": "object"}, '{"anything": [1, 2]}', True),  # no properties declared: open
    ({"type": "array", "items": {"anyOf": [CITY, {"type": "null"}]}}, '[{"city": "P", "x": 1}]', False),
    ({"$defs": {"c": CITY}, "$ref": "#/$defs/c"}, '{"city": "P", "x": 1}', False),
    ({"allOf": [CITY, {"type": "object", "properties": {"n": {"type": "integer"}}}]},
     '{"city": "P", "n": 1}', True),  # allOf members left as written: their intersection holds both
    ({"type": "array", "prefixItems": [{"type": "integer"}]}, "[1]", True),
    ({"type": "array", "prefixItems": [{"type": "integer"}]}, "[1, 2]", False),
    (CITY, "{" + " " * MAX_JSON_WHITESPACE + '"city": "P"}', True),
    (CITY, "{" + " " * (MAX_JSON_WHITESPACE + 1) + '"city": "P"}', False),
    (CITY, '{\n    "city": "Paris"\n}', True),
    ({**CITY, "x-guidance": {"whitespace_flexible": False}}, '{"city":"P"}', True),  # its own say
    ({**CITY, "x-guidance": {"whitespace_flexible": False}}, '{"city": "P"}', False),
], ids=lambda v: json.dumps(v)[:60] if not isinstance(v, bool) else str(v))
def test_what_a_schema_admits(accepts, schema, text, ok):
    assert accepts(schema, text) is ok
    assert accepts(json.dumps(schema), text) is ok  # the schema as JSON text alike


def test_the_given_schema_is_left_alone_and_other_values_pass_through():
    schema = {"type": "object", "properties": {"a": {"type": "object", "properties": {}}}}
    before = json.dumps(schema)
    out = with_vllm_defaults(schema)
    assert json.dumps(schema) == before
    assert out["additionalProperties"] is False and out["properties"]["a"]["additionalProperties"] is False
    assert with_vllm_defaults("{not json") == "{not json" and with_vllm_defaults([1]) == [1]
