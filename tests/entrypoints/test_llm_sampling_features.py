"""Penalties, biases, allowed/bad tokens and logprobs end to end on a tiny random Llama,
against transformers where it implements the same thing."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from test_llm_tiny import PROMPTS, assert_pool_full, make_llm

from jaxvllm import SamplingParams
from jaxvllm.outputs import Logprob

N_NEW = 24


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    return make_llm(tiny_model_dir)


@pytest.fixture(scope="module")
def hf_model(tiny_model_dir):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()


def greedy(**kw):
    return SamplingParams(temperature=0, max_tokens=N_NEW, min_tokens=N_NEW, **kw)


@pytest.mark.parametrize("engine_kwargs", [
    None,
    # chunked prompts (rows that sample nothing must not be counted) and preemption (the
    # row is rebuilt from the tokens so far when the request comes back)
    dict(max_num_batched_tokens=16, max_num_seqs=4, num_gpu_blocks_override=18),
], ids=["plain", "chunked-preempt"])
def test_repetition_penalty_matches_transformers(llm, hf_model, tiny_model_dir, engine_kwargs):
    """transformers' repetition_penalty has vLLM's semantics (prompt and output tokens,
    positive logits divided, others multiplied)."""
    if engine_kwargs is not None:
        llm = make_llm(tiny_model_dir, **engine_kwargs)
    prompts = PROMPTS[:4] if engine_kwargs is None else PROMPTS
    plain = [o.outputs[0].token_ids for o in llm.generate(prompts, greedy(), use_tqdm=False)]
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, greedy(repetition_penalty=1.3),
                                                        use_tqdm=False)]
    with torch.no_grad():
        want = [hf_model.generate(torch.tensor([p]), do_sample=False, max_new_tokens=N_NEW,
                                  min_new_tokens=N_NEW, repetition_penalty=1.3,
                                  pad_token_id=0)[0, len(p):].tolist() for p in prompts]
    assert got == want
    assert got != plain
    # the penalty shows: fewer repeats of earlier tokens than plain greedy
    repeats = lambda p, out: sum(t in p + out[:i] for i, t in enumerate(out))
    assert sum(map(repeats, prompts, got)) < sum(map(repeats, prompts, plain))
    if engine_kwargs is not None:
        assert llm.llm_engine.engine_core.scheduler.num_preemptions > 0
    assert_pool_full(llm)


def test_allowed_token_ids_and_logit_bias(llm):
    allowed = list(range(100, 140))
    outs = llm.generate(PROMPTS[:3], SamplingParams(temperature=1.0, max_tokens=N_NEW, seed=0,
                                                    allowed_token_ids=allowed), use_tqdm=False)
    for o in outs:
        assert set(o.outputs[0].token_ids) <= set(allowed)
    out = llm.generate(PROMPTS[0], greedy(logit_bias={77: 100.0}), use_tqdm=False)[0]
    assert out.outputs[0].token_ids == [77] * N_NEW
    assert_pool_full(llm)


def test_bad_words_never_appear(llm):
    """Digits tokenize to single ids < 256 here (and "07" to two), so a bias towards
    them makes the tiny model emit them; banned, they must vanish."""
    digits = {str(d): 32 + d for d in range(10)}
    bias = {t: 4.0 for t in digits.values()}
    base = llm.generate(PROMPTS[:4], greedy(logit_bias=bias), use_tqdm=False)
    base_ids = [o.outputs[0].token_ids for o in base]
    counts = np.bincount(np.concatenate(base_ids), minlength=256)
    single = max(digits, key=lambda d: counts[digits[d]])  # the most frequent digit
    pairs = [(a, b) for ids in base_ids for a, b in zip(ids, ids[1:])
             if a != digits[single] and b != digits[single] and 32 <= a < 42 and 32 <= b < 42]
    pair = pairs[0]
    word = chr(pair[0] - 32 + 48) + chr(pair[1] - 32 + 48)
    outs = llm.generate(PROMPTS[:4], greedy(logit_bias=bias, bad_words=[single, word]), use_tqdm=False)
    for o in outs:
        ids = o.outputs[0].token_ids
        assert digits[single] not in ids
        assert pair not in list(zip(ids, ids[1:]))
        assert single not in o.outputs[0].text
    assert [o.outputs[0].token_ids for o in outs] != base_ids
    assert_pool_full(llm)


def test_bad_token_ids_are_rejected_naming_the_field(llm):
    for kw, field in [(dict(allowed_token_ids=[1, 300]), "allowed_token_ids"),
                      (dict(logit_bias={256: 1.0}), "logit_bias"),
                      (dict(bad_words=["hello"]), "bad_words")]:  # tokenizes beyond the tiny vocab
        with pytest.raises(ValueError, match=f"^{field} must (lie|tokenize to ids) in"):
            llm.generate(PROMPTS[0], greedy(**kw), use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()
    assert_pool_full(llm)


def test_greedy_logprobs_match_transformers(llm, hf_model):
    k = 5
    outs = llm.generate(PROMPTS[:3], greedy(logprobs=k, repetition_penalty=1.2), use_tqdm=False)
    plain = llm.generate(PROMPTS[:1], greedy(), use_tqdm=False)[0].outputs[0]
    assert plain.logprobs is None and plain.cumulative_logprob is None
    for prompt, out in zip(PROMPTS[:3], outs):
        c = out.outputs[0]
        ids = c.token_ids
        with torch.no_grad():
            logits = hf_model(torch.tensor([prompt + ids])).logits[0].float()
        ref = torch.log_softmax(logits, -1)[len(prompt) - 1:-1].numpy()  # raw: before the penalty
        assert len(c.logprobs) == len(ids)
        for pos, (token, entry) in enumerate(zip(ids, c.logprobs)):
            assert isinstance(entry[token], Logprob)
            assert abs(entry[token].logprob - ref[pos, token]) < 1e-4
            assert entry[token].rank == 1 + int((ref[pos] > ref[pos, token] + 1e-5).sum())
            top = np.argsort(-ref[pos])[:k]
            assert set(entry) == set(top.tolist()) | {token}
            for r, t in enumerate(top, 1):
                assert entry[int(t)].rank == r
                assert abs(entry[int(t)].logprob - ref[pos, t]) < 1e-4
            assert entry[token].decoded_token == llm.get_tokenizer().decode([token])
        assert c.cumulative_logprob == pytest.approx(sum(ref[i, t] for i, t in enumerate(ids)), abs=1e-3)
    assert_pool_full(llm)


def test_prompt_logprobs_match_transformers_across_chunks(tiny_model_dir, hf_model):
    """Prompts longer than the token budget are scored chunk by chunk; a second run of
    the same prompt gets no prefix-cache hit, so it is scored in full again."""
    llm = make_llm(tiny_model_dir, max_num_batched_tokens=16, max_num_seqs=4)
    k = 3
    prompts = [PROMPTS[6], PROMPTS[3], PROMPTS[6]]  # 100 tokens, 1 token, the first again
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=k),
                        use_tqdm=False)
    for prompt, out in zip(prompts, outs):
        with torch.no_grad():
            ref = torch.log_softmax(hf_model(torch.tensor([prompt])).logits[0].float(), -1).numpy()
        got = out.prompt_logprobs
        assert len(got) == len(prompt) and got[0] is None
        for pos in range(1, len(prompt)):
            token, entry = prompt[pos], got[pos]
            assert abs(entry[token].logprob - ref[pos - 1, token]) < 1e-4
            assert entry[token].rank == 1 + int((ref[pos - 1] > ref[pos - 1, token] + 1e-5).sum())
            top = np.argsort(-ref[pos - 1])[:k].tolist()
            assert set(entry) == set(top) | {token}
        assert out.outputs[0].logprobs is None
    assert llm.llm_engine.engine_core.get_stats().prefix_cache_hits == 0
    assert_pool_full(llm)
