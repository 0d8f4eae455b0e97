"""Grammars past the bounds llguidance's native compiler survives are refused by name
before it sees them; a matcher that fails midway ends its request with an error, never a
"stop" on text that breaks the grammar."""
from __future__ import annotations

import json

import numpy as np
import pytest
from sched_harness import make_scheduler

from jaxvllm.core import grammar_limits
from jaxvllm.core.request import Request, RequestStatus
from jaxvllm.core.structured_output import StructuredOutputManager, grammar_for
from jaxvllm.outputs import FinishReason, ModelRunnerOutput
from jaxvllm.sampling_params import SamplingParams
from jaxvllm.sampling_params import StructuredOutputsParams as SOP

PATHOLOGICAL = "^(a|a)*(b|b)*(((a*)*)*)*c{1000}{1000}$"


def ref_chain(n: int, cycle: bool = False) -> dict:
    defs = {f"d{i}": {"$ref": f"#/$defs/d{(i + 1) % n if cycle else i + 1}"} for i in range(n)}
    if not cycle:
        defs[f"d{n}"] = {"type": "string"}
    return {"$defs": defs, "$ref": "#/$defs/d0"}


REFUSED = {
    "5,000-deep $ref chain": (SOP(json=ref_chain(5000)), "deeper than 128 levels"),
    "5,000-long $ref cycle": (SOP(json=ref_chain(5000, cycle=True)), "deeper than 128 levels"),
    "nesting through anyOf refs": (SOP(json={"$defs": {f"d{i}": {"anyOf": [
        {"$ref": f"#/$defs/d{i + 1}"}, {"type": "null"}]} for i in range(300)},
        "$ref": "#/$defs/d0"}), "deeper than 128 levels"),
    "schema text past the size limit": (SOP(json=json.dumps(ref_chain(20_000))), "longer than"),
    "enum of 20,000": (SOP(json={"enum": list(range(20_000))}), "enum/const values"),
    "counted repetitions that multiply": (SOP(json={"type": "string", "pattern": PATHOLOGICAL}),
                                          "pattern expands past"),
    "alternatives repeated": (SOP(regex="(ab|cd|ef){4000}"), "regex expands past"),
    "nested counted groups": (SOP(regex="((a{100}){100}){100}"), "regex expands past"),
}


@pytest.mark.parametrize("params,match", REFUSED.values(), ids=list(REFUSED))
def test_past_a_limit_is_refused_by_name(params, match):
    with pytest.raises(ValueError, match=match) as e:
        grammar_for(params)
    assert str(e.value).startswith("structured_outputs.")


@pytest.mark.parametrize("schema", [
    ref_chain(100), ref_chain(3, cycle=True),
    {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#"}}}},
    {"$defs": {"a": {"type": "integer"}}, "type": "array",  # one def shared by many paths
     "items": {"anyOf": [{"$ref": "#/$defs/a"}] * 50}},
    {"type": "string", "pattern": "^[a-z]{1,5000}$"},
])
def test_ordinary_schemas_compile(schema):
    grammar_for(SOP(json=schema))


def test_a_grammar_that_fails_midway_ends_with_an_error(monkeypatch):
    """The limit is raised so that llguidance's lexer meets `c{1000}{1000}` and gives up
    after a few tokens, allowing only EOS: the request ends with FINISHED_ERROR, the
    matcher's reason, and its pages back in the pool."""
    from jaxvllm.transformers_utils.model_path import default_model_path
    from jaxvllm.transformers_utils.tokenizer import load_tokenizer

    monkeypatch.setattr(grammar_limits, "MAX_REGEX_SIZE", 10**9)
    tokenizer = load_tokenizer(default_model_path())
    manager = StructuredOutputManager(lambda: tokenizer, len(tokenizer))
    sched = make_scheduler(max_num_seqs=2, max_num_batched_tokens=64, max_model_len=64, num_blocks=9,
                           block_size=16, structured_output_manager=manager)
    params = SamplingParams(max_tokens=30, structured_outputs=SOP(json={
        "type": "string", "pattern": PATHOLOGICAL}))
    request = Request("r", [1, 2, 3], params, tokenizer.eos_token_id, 0)
    sched.add_request(request)
    finished = None
    for _ in range(30):
        so = sched.schedule()
        words = np.array(so.grammar_bitmask["r"], np.int32)
        allowed = np.flatnonzero(np.unpackbits(words.view(np.uint8), bitorder="little"))
        token = int(allowed[min(5, len(allowed) - 1)])  # '"', then runs of "c"
        out = sched.update_from_output(so, ModelRunnerOutput(["r"], [[token]]))
        if out[0].finished:
            finished = out[0]
            break
    assert finished is not None and finished.finish_reason == FinishReason.ERROR
    assert "structured_outputs" in finished.error and "lexer" in finished.error
    assert request.status == RequestStatus.FINISHED_ERROR
    assert not sched.has_unfinished_requests() and not manager.matchers
    assert sched.kv_cache_manager.block_pool.get_num_free_blocks() == 8
