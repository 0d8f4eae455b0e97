"""LLM end to end on tiny random mixture-of-experts models written by transformers: 32-token
greedy output equal to transformers' `generate` with chunked prefill and preemption, and with
speculative decoding equal to the plain engine's (the experts
packed for the native kernel, on a CPU that has it), and no
compilation after warm-up under a mixed workload."""
from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from conftest import assert_every_spec_method_keeps, write_tiny_moe

from jaxvllm import LLM, SamplingParams
from jaxvllm.backends.cpu import native_kernels_available
from jaxvllm.kernels.cpu.packed_matmul import PANEL
from jaxvllm.layers.packed_linear import PackedFusedMoEMethod
from jaxvllm.sampling_params import StructuredOutputsParams

PROMPTS = [[int(t) for t in np.random.default_rng(i).integers(3, 256, n)] for i, n in enumerate([5, 40, 17, 70])]
N_NEW = 32


@pytest.fixture(scope="module")
def moe_model_dir(tmp_path_factory):
    """arch -> a tiny MoE checkpoint with the default model's tokenizer (prompts are token
    ids), written once per module."""
    from jaxvllm.transformers_utils.model_path import default_model_path
    from jaxvllm.transformers_utils.tokenizer import load_tokenizer

    @functools.cache
    def make(arch: str):
        path = tmp_path_factory.mktemp(arch)
        write_tiny_moe(path, arch)
        load_tokenizer(default_model_path()).save_pretrained(path)
        return path
    return make


@pytest.mark.parametrize("arch", ["Mixtral", "Qwen3Moe"])
def test_greedy_matches_transformers_chunked_and_preempted(moe_model_dir, arch):
    path = moe_model_dir(arch)
    from transformers import AutoModelForCausalLM
    ref = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    with torch.no_grad():
        expected = [ref.generate(torch.tensor([p]), do_sample=False, max_new_tokens=N_NEW, min_new_tokens=N_NEW,
                                 pad_token_id=0)[0, len(p):].tolist() for p in PROMPTS]
    # 32-token steps cut the long prompts into chunks; 10 pages cannot hold every request.
    llm = LLM(str(path), max_num_seqs=4, max_num_batched_tokens=32, max_model_len=128,
              num_gpu_blocks_override=10, skip_warmup=True)
    outputs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=N_NEW, min_tokens=N_NEW),
                           use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == expected
    core = llm.llm_engine.engine_core
    assert core.scheduler.num_preemptions > 0
    pool = core.scheduler.kv_cache_manager.block_pool
    assert pool.get_num_free_blocks() == pool.num_blocks - 1
    if native_kernels_available():  # on one CPU device, where `auto` picks the native kernels, experts are packed
        model = core.model_executor.driver_worker.model
        assert isinstance(model.quant_config.moe_method, PackedFusedMoEMethod)
        assert model.layers[0]["experts_gate_up"].get_value().shape[-1] == PANEL
    # Speculative decoding in the same small pool gives the same greedy tokens (ignore_eos:
    # min_tokens gets no drafts).
    params = SamplingParams(temperature=0, max_tokens=N_NEW, ignore_eos=True)
    plain = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)]
    llm.llm_engine.shutdown()
    assert_spec_decoding_keeps(path, plain, params)


def assert_spec_decoding_keeps(path, plain, params):
    """Every method (the model as its own draft model; a random EAGLE-3 head reading the
    hidden states entering layers 0, 1 and after the last) gives the plain engine's greedy
    tokens in a pool of 10 pages where requests are preempted, every draft of the draft model
    accepted, every block returned."""
    assert_every_spec_method_keeps(path, PROMPTS, plain, params, (0, 1, 2), preempts=True, max_num_seqs=4,
                                   max_num_batched_tokens=32, max_model_len=128, num_gpu_blocks_override=10)


def test_spec_decoding_keeps_greedy_output_on_qwen2_moe(moe_model_dir):
    """Qwen2-MoE (shared experts) too; its transformers parity is tested with the others' in
    tests/models."""
    path = moe_model_dir("Qwen2Moe")
    params = SamplingParams(temperature=0, max_tokens=N_NEW, ignore_eos=True)
    llm = LLM(str(path), max_num_seqs=4, max_num_batched_tokens=32, max_model_len=128, skip_warmup=True)
    plain = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)]
    llm.llm_engine.shutdown()
    assert_spec_decoding_keeps(path, plain, params)


def test_compilations_fixed_after_warmup(moe_model_dir, fresh_executables):
    llm = LLM(str(moe_model_dir("Qwen3Moe")), max_num_seqs=4, max_num_batched_tokens=32, max_model_len=256,
              num_gpu_blocks_override=128, skip_warmup=False, check_recompilation=True)
    runner = llm.llm_engine.engine_core.model_executor.driver_worker.model_runner
    after_warmup = runner.num_compilations
    assert after_warmup == 2 * len(runner.token_buckets) + 4 * len(runner.request_buckets) + 1
    rng = np.random.default_rng(0)
    prompts = [[int(t) for t in rng.integers(3, 256, rng.integers(1, 120))] for _ in range(24)]
    features = [dict(), dict(repetition_penalty=1.3), dict(logprobs=3), dict(prompt_logprobs=2),
                dict(structured_outputs=StructuredOutputsParams(regex="[0-9]+"))]
    params = [SamplingParams(temperature=float(rng.choice([0.0, 0.8])), top_k=int(rng.choice([0, 20])),
                             max_tokens=int(rng.integers(1, 24)), seed=i, **features[i % len(features)])
              for i in range(24)]
    assert len(llm.generate(prompts, params, use_tqdm=False)) == 24
    assert runner.num_compilations == after_warmup
