"""LLM.beam_search against transformers' beam search (num_beams=4) on a tiny model."""
from __future__ import annotations

import pytest
import torch
from test_llm_tiny import PROMPTS, assert_pool_full, make_llm

from jaxvllm.sampling_params import BeamSearchParams

N_NEW, WIDTH = 8, 4


def test_beam_search_matches_transformers(tiny_model_dir):
    from transformers import AutoModelForCausalLM
    hf = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()
    llm = make_llm(tiny_model_dir)
    prompts = PROMPTS[:3]
    outs = llm.beam_search([{"prompt_token_ids": p} for p in prompts],
                           BeamSearchParams(beam_width=WIDTH, max_tokens=N_NEW, ignore_eos=True))
    for prompt, out in zip(prompts, outs):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([prompt]), do_sample=False, num_beams=WIDTH,
                              num_return_sequences=WIDTH, max_new_tokens=N_NEW, min_new_tokens=N_NEW,
                              output_scores=True, return_dict_in_generate=True, pad_token_id=0)
        want = [s[len(prompt):].tolist() for s in ref.sequences]
        got = [s.tokens[len(prompt):] for s in out.sequences]
        assert got == want
        assert all(s.tokens[:len(prompt)] == prompt for s in out.sequences)
        # transformers' score is the sum of logprobs over the generated length
        assert [s.cum_logprob for s in out.sequences] == pytest.approx(
            (ref.sequences_scores * N_NEW).tolist(), abs=1e-3)
    assert_pool_full(llm)
    stats = llm.llm_engine.engine_core.get_stats()
    assert stats.prefix_cache_hits > 0  # beams reuse their shared history's blocks
