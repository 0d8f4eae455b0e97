"""Structured output (llguidance bitmask applied on device) on a tiny random Llama.

Digits tokenize to single ids below the tiny model's 256 here, and JSON's punctuation
has one-character tokens there too, so the grammars below can be met."""
from __future__ import annotations

import json
import re

import pytest
from test_llm_tiny import PROMPTS, assert_pool_full, make_llm

from jaxvllm import SamplingParams
from jaxvllm.sampling_params import StructuredOutputsParams


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    return make_llm(tiny_model_dir)


def constrained(temperature=0.0, **kw):
    return SamplingParams(temperature=temperature, max_tokens=40, seed=0,
                          structured_outputs=StructuredOutputsParams(**kw))


def test_regex_and_choice_are_obeyed_beside_free_requests(llm):
    free = SamplingParams(temperature=0, max_tokens=12)
    baseline = [o.outputs[0].token_ids for o in llm.generate(PROMPTS[:2], free, use_tqdm=False)]
    params = [constrained(regex="[0-9]{3}-[0-9]{2}"), constrained(1.0, regex="[0-9]{3}-[0-9]{2}"),
              constrained(choice=["12", "345", "6789"]), free, free]
    outs = llm.generate(PROMPTS[:3] + PROMPTS[:2], params, use_tqdm=False)
    for out in outs[:2]:
        assert re.fullmatch(r"[0-9]{3}-[0-9]{2}", out.outputs[0].text)
        assert out.outputs[0].finish_reason == "stop"  # EOS, allowed once the grammar is complete
    assert outs[2].outputs[0].text in ("12", "345", "6789")
    assert [o.outputs[0].token_ids for o in outs[3:]] == baseline
    assert_pool_full(llm)


def test_json_schema_is_obeyed(llm):
    """An array, so every forced piece is one character (llguidance forces a multi-byte
    run such as '{"' as its canonical token, which lies beyond the tiny vocabulary)."""
    schema = {"type": "array", "items": {"enum": [1, 22, 303]}, "minItems": 1, "maxItems": 3,
              "x-guidance": {"whitespace_flexible": False}}  # llguidance's option: no free whitespace
    outs = llm.generate(PROMPTS[:3], constrained(1.0, json=schema), use_tqdm=False)
    for out in outs:
        value = json.loads(out.outputs[0].text)
        assert 1 <= len(value) <= 3 and all(v in (1, 22, 303) for v in value)
    assert_pool_full(llm)


def test_bad_grammar_is_rejected_naming_the_field(llm):
    with pytest.raises(ValueError, match="^structured_outputs does not compile"):
        llm.generate(PROMPTS[0], constrained(regex="[0-9"), use_tqdm=False)
    with pytest.raises(ValueError, match="^structured_outputs must set exactly one"):
        StructuredOutputsParams(regex="a", choice=["b"])
    assert not llm.llm_engine.has_unfinished_requests()
    assert_pool_full(llm)


def test_grammars_that_would_crash_the_compiler_are_refused_offline(llm):
    """The offline path refuses them too, and the same process generates right after."""
    chain = {"$defs": {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(5000)}, "$ref": "#/$defs/d0"}
    with pytest.raises(ValueError, match="deeper than 128 levels"):
        llm.generate(PROMPTS[0], constrained(json=chain), use_tqdm=False)
    lark = "start: a0\n" + "".join(f"a{i}: a{i + 1}\n" for i in range(5000)) + 'a5000: "7"\n'
    with pytest.raises(ValueError, match="crashed its compiler"):
        llm.generate(PROMPTS[0], constrained(grammar=lark), use_tqdm=False)
    out = llm.generate(PROMPTS[0], constrained(regex="[0-9]{2}"), use_tqdm=False)[0]
    assert re.fullmatch(r"[0-9]{2}", out.outputs[0].text)
    assert not llm.llm_engine.has_unfinished_requests()
    assert_pool_full(llm)
