"""A request's grammar mask work is bounded: a grammar whose masks are slow to compute (many
regexes alive at once, their lexer states built as the reply goes) ends its own request with
an error naming the limit, while the request beside it decodes on; the pages come back.
Past llguidance's per-step limits, and past the CPU-time budget."""
from __future__ import annotations

import numpy as np
import pytest
from sched_harness import make_scheduler

from jaxvllm.core import structured_output
from jaxvllm.core.request import Request
from jaxvllm.core.structured_output import StructuredOutputManager
from jaxvllm.outputs import FinishReason, ModelRunnerOutput
from jaxvllm.sampling_params import SamplingParams
from jaxvllm.sampling_params import StructuredOutputsParams as SOP
from jaxvllm.transformers_utils.model_path import default_model_path
from jaxvllm.transformers_utils.tokenizer import load_tokenizer

# Sixty regexes alive at every position, each a DFA that grows with the text (`[a-z]*` then
# a letter then a count): llguidance's first mask for it builds states for all of them.
SLOW = "start: x+\nx: " + " | ".join(f"/[a-z]*{chr(97 + i % 26)}[a-z]{{{6 + i % 9}}}/" for i in range(60))


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(default_model_path())


def run_beside(tokenizer, grammar: SOP) -> tuple[dict, object]:
    """The grammar's request beside a plain JSON one, each sampling the first token its mask
    allows, until both end; their last outputs by request id, and the scheduler."""
    manager = StructuredOutputManager(lambda: tokenizer, len(tokenizer))
    sched = make_scheduler(max_num_seqs=2, max_num_batched_tokens=64, max_model_len=64, num_blocks=9,
                           block_size=16, structured_output_manager=manager)
    plain = SOP(json={"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})
    for req_id, params in (("slow", grammar), ("plain", plain)):
        sched.add_request(Request(req_id, [1, 2, 3], SamplingParams(max_tokens=12, structured_outputs=params),
                                  tokenizer.eos_token_id, 0))
    last = {}
    for _ in range(20):
        if not sched.has_unfinished_requests():
            break
        so = sched.schedule()
        sampled = []
        for req_id in so.num_scheduled_tokens:
            words = np.array(so.grammar_bitmask[req_id], np.int32)
            sampled.append([int(np.flatnonzero(np.unpackbits(words.view(np.uint8), bitorder="little"))[0])])
        for out in sched.update_from_output(so, ModelRunnerOutput(list(so.num_scheduled_tokens), sampled)):
            last[out.request_id] = out
    assert not sched.has_unfinished_requests() and not manager.matchers and not manager.budget_s
    assert sched.kv_cache_manager.block_pool.get_num_free_blocks() == 8
    return last, sched


def test_a_grammar_past_the_per_step_limits_ends_alone(tokenizer):
    last, _ = run_beside(tokenizer, SOP(grammar=SLOW))
    assert last["slow"].finish_reason == FinishReason.ERROR
    assert last["slow"].error.startswith("structured_outputs: computing the grammar's next-token mask went "
                                         "past its per-step limit (lexer error: too many")
    assert last["plain"].finish_reason != FinishReason.ERROR and last["plain"].error is None


def test_a_request_past_its_time_budget_ends_with_the_budgets_error(tokenizer, monkeypatch):
    """A budget of no CPU time at all: each request's first mask spends it, its next mask
    allows EOS alone, and the token sampled from it ends the request with the error."""
    monkeypatch.setattr(structured_output, "MASK_BUDGET_S", 0.0)
    monkeypatch.setattr(structured_output, "MASK_REFILL_S", 0.0)
    last, _ = run_beside(tokenizer, SOP(regex="[a-z]{1,20}"))
    for out in last.values():
        assert out.finish_reason == FinishReason.ERROR and len(out.new_token_ids) == 1
        assert out.error.startswith("structured_outputs: computing the grammar's token masks took more than "
                                    "its budget (0 s of CPU time plus 0 ms per token)")
