"""LLM end to end on a tiny random Llama: greedy parity with transformers under chunked
prefill and preemption, seeds, stop strings, bad input, and the pool's accounting."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from jaxvllm import LLM, SamplingParams
from jaxvllm.sampling_params import StructuredOutputsParams

PROMPTS = [[int(t) for t in np.random.default_rng(i).integers(3, 256, n)]
           for i, n in enumerate([5, 17, 33, 1, 64, 16, 100, 9])]
N_NEW = 24


@pytest.fixture(scope="module")
def hf_greedy(tiny_model_dir):
    from transformers import AutoModelForCausalLM
    ref = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for p in PROMPTS:
            ids = ref.generate(torch.tensor([p]), do_sample=False, max_new_tokens=N_NEW,
                               min_new_tokens=N_NEW, pad_token_id=0)
            out.append(ids[0, len(p):].tolist())
    return out


def make_llm(path, **kwargs):
    args = dict(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=256, num_gpu_blocks_override=128,
                skip_warmup=True)
    args.update(kwargs)
    return LLM(str(path), **args)


def assert_pool_full(llm):
    core = llm.llm_engine.engine_core
    pool = core.scheduler.kv_cache_manager.block_pool
    assert pool.get_num_free_blocks() == pool.num_blocks - 1
    assert not any(m.req_to_blocks for m in core.scheduler.kv_cache_manager.managers)
    assert not core.scheduler.requests


GREEDY = SamplingParams(temperature=0, max_tokens=N_NEW, min_tokens=N_NEW)


@pytest.mark.parametrize("engine_kwargs", [
    dict(),
    dict(max_num_batched_tokens=16, max_num_seqs=4),  # every long prompt is chunked
    dict(num_gpu_blocks_override=18),                 # too few pages: preemption
], ids=["plain", "chunked", "preempt"])
def test_greedy_matches_transformers(tiny_model_dir, hf_greedy, engine_kwargs):
    llm = make_llm(tiny_model_dir, **engine_kwargs)
    outputs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == hf_greedy
    assert [o.prompt_token_ids for o in outputs] == PROMPTS
    assert all(o.finished and o.outputs[0].finish_reason == "length" for o in outputs)
    if "num_gpu_blocks_override" in engine_kwargs:
        assert llm.llm_engine.engine_core.scheduler.num_preemptions > 0
    assert_pool_full(llm)


def test_compilations_fixed_after_warmup(tiny_model_dir, fresh_executables):
    # check_recompilation: any program compiled by a step after warm-up raises there.
    llm = make_llm(tiny_model_dir, skip_warmup=False, max_num_batched_tokens=128, check_recompilation=True)
    runner = llm.llm_engine.engine_core.model_executor.driver_worker.model_runner
    after_warmup = runner.num_compilations
    # tokens x (forward, prompt logprobs), requests x (greedy, random) x (plain, extended),
    # one row writer
    assert after_warmup == 2 * len(runner.token_buckets) + 4 * len(runner.request_buckets) + 1
    rng = np.random.default_rng(0)
    prompts = [[int(t) for t in rng.integers(3, 256, rng.integers(1, 200))] for _ in range(64)]
    features = [dict(), dict(repetition_penalty=1.3), dict(presence_penalty=0.5, frequency_penalty=0.5),
                dict(logit_bias={5: 3.0}), dict(allowed_token_ids=list(range(10, 60))),
                dict(bad_words=["7", "01"]), dict(logprobs=3), dict(prompt_logprobs=2, logprobs=0),
                dict(structured_outputs=StructuredOutputsParams(regex="[0-9]+"))]
    params = [SamplingParams(temperature=float(rng.choice([0.0, 0.8])), top_p=float(rng.choice([1.0, 0.9])),
                             top_k=int(rng.choice([0, 20])), max_tokens=int(rng.integers(1, 40)), seed=i,
                             **(features[rng.integers(len(features))] if i % 2 else {}))
              for i in range(64)]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert len(outputs) == 64
    assert runner.num_compilations == after_warmup
    assert_pool_full(llm)


def test_seed_reproducible_regardless_of_batch(tiny_model_dir):
    llm = make_llm(tiny_model_dir)
    params = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=16, seed=1234)
    alone = llm.generate([PROMPTS[1]], params, use_tqdm=False)[0].outputs[0].token_ids
    others = [SamplingParams(temperature=1.0, max_tokens=16, seed=s) for s in range(5)]
    batch = llm.generate(PROMPTS[2:7] + [PROMPTS[1]], others + [params], use_tqdm=False)
    assert batch[-1].outputs[0].token_ids == alone
    unseeded = llm.generate([PROMPTS[1]] * 2, SamplingParams(temperature=1.0, max_tokens=16), use_tqdm=False)
    assert unseeded[0].outputs[0].token_ids != unseeded[1].outputs[0].token_ids


def test_stop_conditions(tiny_model_dir, hf_greedy):
    llm = make_llm(tiny_model_dir)
    expected = hf_greedy[0]
    # stop_token_ids: ends on that token, which is kept in token_ids
    stop_tok = expected[5]
    first = expected.index(stop_tok)
    out = llm.generate([PROMPTS[0]], SamplingParams(temperature=0, max_tokens=N_NEW, stop_token_ids=[stop_tok]),
                       use_tqdm=False)[0].outputs[0]
    assert out.token_ids == expected[:first + 1]
    assert (out.finish_reason, out.stop_reason) == ("stop", stop_tok)
    # min_tokens keeps a stop token from ending the request early
    out = llm.generate([PROMPTS[0]], SamplingParams(temperature=0, max_tokens=N_NEW, min_tokens=N_NEW,
                                                    stop_token_ids=[stop_tok]), use_tqdm=False)[0].outputs[0]
    assert len(out.token_ids) == N_NEW and out.finish_reason == "length"
    # stop strings are found in the detokenized text, which is cut before them
    full = llm.generate([PROMPTS[0]], SamplingParams(temperature=0, max_tokens=N_NEW, min_tokens=N_NEW),
                        use_tqdm=False)[0].outputs[0].text
    stop = full[2:4]  # early: without min_tokens this random model samples EOS within ten tokens
    out = llm.generate([PROMPTS[0]], SamplingParams(temperature=0, max_tokens=N_NEW, stop=stop),
                       use_tqdm=False)[0].outputs[0]
    assert out.text == full[:full.index(stop)]
    assert (out.finish_reason, out.stop_reason) == ("stop", stop)
    out = llm.generate([PROMPTS[0]], SamplingParams(temperature=0, max_tokens=N_NEW, stop=stop,
                                                    include_stop_str_in_output=True), use_tqdm=False)[0].outputs[0]
    assert out.text == full[:full.index(stop) + len(stop)]
    assert_pool_full(llm)


def test_max_model_len_caps_generation(tiny_model_dir):
    llm = make_llm(tiny_model_dir, max_model_len=40)
    out = llm.generate([PROMPTS[2]], SamplingParams(temperature=0, max_tokens=100), use_tqdm=False)[0]
    assert len(PROMPTS[2]) + len(out.outputs[0].token_ids) == 40
    assert out.outputs[0].finish_reason == "length"
    assert_pool_full(llm)


def test_bad_input_is_rejected_and_nothing_leaks(tiny_model_dir):
    llm = make_llm(tiny_model_dir, max_model_len=64)
    with pytest.raises(ValueError, match="maximum model length of 64"):
        llm.generate([PROMPTS[0], PROMPTS[6]], GREEDY, use_tqdm=False)
    with pytest.raises(ValueError, match=r"prompt_token_ids must lie in \[0, 256\)"):
        llm.generate([[1, 2, 999]], GREEDY, use_tqdm=False)
    with pytest.raises(ValueError, match="empty"):
        llm.generate([[]], GREEDY, use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()
    assert_pool_full(llm)
    # the engine still serves after the errors
    assert len(llm.generate([PROMPTS[0]], GREEDY, use_tqdm=False)[0].outputs[0].token_ids) == N_NEW


def test_kv_cache_must_hold_max_model_len(tiny_model_dir):
    with pytest.raises(ValueError, match="fewer than max_model_len"):
        make_llm(tiny_model_dir, num_gpu_blocks_override=4, max_model_len=256)
