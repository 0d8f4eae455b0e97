"""Prefix caching, swap preemption and priority end to end on the tiny random Llama:
greedy outputs never change, shared prefixes are computed once, compiles stay fixed."""
from __future__ import annotations

import argparse

import numpy as np
import pytest

from jaxvllm import LLM, SamplingParams
from jaxvllm.config import EngineArgs
from jaxvllm.entrypoints.cli_args import add_engine_flags, engine_args

rng = np.random.default_rng(0)
PREFIX = [int(t) for t in rng.integers(3, 256, 128)]
SHARED = [PREFIX + [int(t) for t in rng.integers(3, 256, 8)] for _ in range(16)]
MIXED = [[int(t) for t in rng.integers(3, 256, n)] for n in (5, 40, 17, 64)] + SHARED[:4]
GREEDY = SamplingParams(temperature=0, max_tokens=12, min_tokens=12)


def make_llm(path, **kwargs):
    args = dict(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=256, num_gpu_blocks_override=128,
                skip_warmup=True)
    args.update(kwargs)
    return LLM(str(path), **args)


def greedy(llm, prompts):
    return [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY, use_tqdm=False)]


def stats(llm):
    return llm.llm_engine.engine_core.get_stats()


def assert_pool_whole(llm):
    sched = llm.llm_engine.engine_core.scheduler
    pool = sched.kv_cache_manager.block_pool
    assert pool.get_num_free_blocks() == pool.num_blocks - 1
    assert all(b.ref_cnt == 0 for b in pool.blocks[1:]) and not sched.requests
    if sched.swap_space is not None:
        assert sched.swap_space.get_num_free_slots() == sched.swap_space.num_slots


@pytest.fixture(scope="module")
def reference(tiny_model_dir):
    """Caching off, recompute, a roomy pool: the outputs everything else must reproduce."""
    llm = make_llm(tiny_model_dir, enable_prefix_caching=False, num_gpu_blocks_override=160)
    return {"shared": greedy(llm, SHARED), "mixed": greedy(llm, MIXED),
            "prefill_tokens": stats(llm).num_prefill_tokens}


def test_shared_prefix_computes_far_fewer_prefill_tokens(tiny_model_dir, reference):
    llm = make_llm(tiny_model_dir)
    assert greedy(llm, SHARED) == reference["shared"]
    s = stats(llm)
    # Off: the SHARED run alone computed every prompt token (the MIXED run came after).
    assert reference["prefill_tokens"] >= sum(map(len, SHARED))
    assert s.num_prefill_tokens <= 0.15 * sum(map(len, SHARED))
    assert s.prefix_cache_hits >= 15 * 128 and s.prefix_cache_hit_rate > 0.85
    assert_pool_whole(llm)
    # A second pass hits everything but the last block of each prompt.
    assert greedy(llm, SHARED) == reference["shared"]
    assert llm.reset_prefix_cache()


@pytest.mark.parametrize("engine_kwargs", [
    dict(num_gpu_blocks_override=18),
    dict(num_gpu_blocks_override=18, preemption_mode="swap", swap_space=0.01),
    dict(num_gpu_blocks_override=18, preemption_mode="swap", swap_space=0.01, enable_prefix_caching=False),
    dict(num_gpu_blocks_override=18, preemption_mode="swap", swap_space=1e-5),  # one host slot: falls back
], ids=["recompute", "swap", "swap-nocache", "swap-short"])
def test_preemption_modes_give_identical_greedy_outputs(tiny_model_dir, reference, engine_kwargs):
    llm = make_llm(tiny_model_dir, **engine_kwargs)
    assert greedy(llm, MIXED) == reference["mixed"]
    s = stats(llm)
    assert s.num_preemptions > 0
    if engine_kwargs.get("preemption_mode") == "swap":
        assert s.num_swap_outs > 0 if engine_kwargs["swap_space"] >= 0.01 else s.num_swap_outs < s.num_preemptions
    assert_pool_whole(llm)


def test_compilations_fixed_with_swap_and_caching(tiny_model_dir, reference, fresh_executables):
    llm = make_llm(tiny_model_dir, skip_warmup=False, num_gpu_blocks_override=18,
                   preemption_mode="swap", swap_space=0.01)
    runner = llm.llm_engine.engine_core.model_executor.driver_worker.model_runner
    after_warmup = runner.num_compilations
    assert after_warmup == (2 * len(runner.token_buckets) + 4 * len(runner.request_buckets) + 1
                            + 2 * len(runner.swapper.copier.buckets))
    assert greedy(llm, MIXED) == reference["mixed"]
    assert stats(llm).num_swap_outs > 0
    assert runner.num_compilations == after_warmup


def test_priority_is_passed_through_generate(tiny_model_dir, reference):
    llm = make_llm(tiny_model_dir, scheduling_policy="priority")
    outs = llm.generate(MIXED, GREEDY, priority=[2, 0, 1, 0, 3, 1, 2, 0], use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == reference["mixed"]
    with pytest.raises(ValueError, match="priorities"):
        llm.generate(MIXED[:2], priority=[0])
    fcfs = make_llm(tiny_model_dir)
    with pytest.raises(ValueError, match="scheduling_policy='priority'"):
        fcfs.generate(MIXED[:1], priority=[1], use_tqdm=False)


def test_cli_flags_for_the_new_engine_args():
    parser = argparse.ArgumentParser()
    add_engine_flags(parser)
    ns = parser.parse_args(["--preemption-mode", "swap", "--swap-space", "0.5", "--no-enable-prefix-caching",
                            "--scheduling-policy", "priority", "--long-prefill-token-threshold", "32"])
    args = engine_args(ns)
    assert (args.preemption_mode, args.swap_space, args.enable_prefix_caching) == ("swap", 0.5, False)
    assert (args.scheduling_policy, args.long_prefill_token_threshold) == ("priority", 32)
    assert engine_args(parser.parse_args([])).enable_prefix_caching is EngineArgs.enable_prefix_caching is True
