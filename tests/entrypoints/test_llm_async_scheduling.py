"""Async scheduling (step n + 1 scheduled while step n runs, its tokens read a step late)
gives exactly the outputs of synchronous steps, feature by feature, on a tiny random Llama;
a request that a late-found stop ends never emits the extra token, and every KV block
returns to the pool after every run."""
from __future__ import annotations

import pytest
from test_llm_tiny import PROMPTS, assert_pool_full, make_llm

from jaxvllm import SamplingParams
from jaxvllm.sampling_params import StructuredOutputsParams

N_NEW = 16
CONFIGS = {
    "plain": dict(),
    "chunked": dict(max_num_batched_tokens=16, max_num_seqs=4),
    "preempt": dict(num_gpu_blocks_override=18),
    "preempt-swap": dict(num_gpu_blocks_override=18, preemption_mode="swap", swap_space=0.01),
}


@pytest.fixture(scope="module")
def engines(tiny_model_dir):
    """(sync, async) engines per configuration, built once."""
    return {name: tuple(make_llm(tiny_model_dir, async_scheduling=a, **kw) for a in (False, True))
            for name, kw in CONFIGS.items()}


def summary(outputs):
    """Everything a user sees of each output."""
    return [(o.prompt_logprobs,
             [(c.index, c.token_ids, c.text, c.finish_reason, c.stop_reason, c.logprobs,
               c.cumulative_logprob) for c in o.outputs]) for o in outputs]


def run_both(engines, config, prompts, params):
    sync, async_ = engines[config]
    assert not sync.llm_engine.engine_core.async_scheduling and async_.llm_engine.engine_core.async_scheduling
    results = [summary(llm.generate(prompts, params, use_tqdm=False)) for llm in (sync, async_)]
    assert_pool_full(sync)
    assert_pool_full(async_)
    assert not async_.llm_engine.engine_core.has_unfinished_requests()
    return results


@pytest.mark.parametrize("config", list(CONFIGS))
def test_greedy_and_sampled_match(engines, config):
    params = [SamplingParams(temperature=0, max_tokens=N_NEW, min_tokens=N_NEW),
              SamplingParams(temperature=0.9, top_p=0.9, top_k=40, seed=7, max_tokens=N_NEW)] * 4
    sync, async_ = run_both(engines, config, PROMPTS, params)
    assert sync == async_
    if config.startswith("preempt"):
        scheduler = engines[config][1].llm_engine.engine_core.scheduler
        assert scheduler.num_preemptions > 0
        assert (scheduler.num_swap_outs > 0) == (config == "preempt-swap")


def test_stops_found_a_step_late_emit_nothing_more(engines):
    """EOS-like stop tokens, stop strings and max_tokens end the request at the same token
    with async scheduling, though the step after it was already running."""
    sync_llm = engines["plain"][0]
    full = sync_llm.generate(PROMPTS[:4], SamplingParams(temperature=0, max_tokens=N_NEW), use_tqdm=False)
    params = []
    for o in full:
        c = o.outputs[0]
        params.append(SamplingParams(temperature=0, max_tokens=N_NEW, stop_token_ids=[c.token_ids[5]]))
        params.append(SamplingParams(temperature=0, max_tokens=N_NEW, stop=[c.text[len(c.text) // 2:][:2]]))
        params.append(SamplingParams(temperature=0, max_tokens=3))
    prompts = [p for p in PROMPTS[:4] for _ in range(3)]
    sync, async_ = run_both(engines, "plain", prompts, params)
    assert sync == async_
    finishes = [c[3] for _, outs in async_ for c in outs]
    assert finishes.count("stop") >= 4 and finishes.count("length") >= 4


@pytest.mark.parametrize("config", ["plain", "chunked"])
def test_penalties_logprobs_and_n_match(engines, config):
    params = [SamplingParams(temperature=0, max_tokens=N_NEW, repetition_penalty=1.3,
                             presence_penalty=0.5, frequency_penalty=0.5),
              SamplingParams(temperature=0, max_tokens=N_NEW, logprobs=3, prompt_logprobs=2),
              SamplingParams(temperature=0.8, seed=3, max_tokens=N_NEW, n=3),
              SamplingParams(temperature=0, max_tokens=N_NEW, min_tokens=8, logit_bias={2: 5.0},
                             ignore_eos=False, stop_token_ids=[2])]
    sync, async_ = run_both(engines, config, PROMPTS[:4], params)
    assert sync == async_


def test_structured_output_and_bad_words_match(engines):
    """Their next step needs the last token on the host: such steps run synchronously."""
    params = [SamplingParams(temperature=0.8, seed=1, max_tokens=N_NEW,
                             structured_outputs=StructuredOutputsParams(regex="[0-9]{3,6}")),
              SamplingParams(temperature=0, max_tokens=N_NEW, bad_words=["01", "7"]),
              SamplingParams(temperature=0, max_tokens=N_NEW)]
    sync, async_ = run_both(engines, "plain", PROMPTS[:3], params)
    assert sync == async_


def test_abort_while_a_step_is_in_flight(engines):
    """Aborted mid-run, a request's blocks return at once and its in-flight token is
    dropped; the others finish exactly as without async scheduling."""
    outs = {}
    for llm in engines["plain"]:
        engine = llm.llm_engine
        for i, p in enumerate(PROMPTS[:4]):
            engine.add_request(f"r{i}", {"prompt_token_ids": p},
                               SamplingParams(temperature=0, max_tokens=N_NEW))
        got = {}
        for step in range(200):
            for o in engine.step():
                got[o.request_id] = o.outputs[0].token_ids
            if step == 4:
                assert (engine.engine_core._in_flight is not None) == engine.engine_core.async_scheduling
                engine.abort_request(["r1"])
            if not engine.has_unfinished_requests():
                break
        assert_pool_full(llm)
        outs[llm.llm_engine.engine_core.async_scheduling] = got
    aborted = [outs[a].pop("r1") for a in (False, True)]
    assert outs[False] == outs[True]
    assert all(len(tokens) < N_NEW for tokens in aborted)
