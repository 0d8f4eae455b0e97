"""Penalties, biases, allowed/bad tokens and logprobs against plain-numpy copies of
vLLM's semantics, on random logits and random persistent rows."""
from __future__ import annotations

import jax
import numpy as np
import pytest

from jaxvllm.core.sched_output import CachedRequestData, NewRequestData, SchedulerOutput
from jaxvllm.sampling_params import MAX_LOGPROBS, SamplingParams
from jaxvllm.worker import penalties, sampler
from jaxvllm.worker.input_batch import InputBatch
from jaxvllm.worker.penalties import PenaltyMetadata, PenaltyState
from jaxvllm.worker.sampler import SamplingMetadata

V, S, R = 97, 6, 4


def make_md(rows, vocab, temperature=0.0, suppress=None):
    """Sampling metadata with no filters; suppress: per-row id lists of equal length."""
    ids = np.asarray(suppress if suppress else [[vocab]] * rows, np.int32)
    return SamplingMetadata(
        temperature=np.broadcast_to(np.asarray(temperature, np.float32), (rows,)).copy(),
        top_k=np.zeros(rows, np.int32), top_p=np.ones(rows, np.float32), min_p=np.zeros(rows, np.float32),
        seed=np.stack([np.zeros(rows), np.arange(rows)], 1).astype(np.uint32),
        step=np.zeros(rows, np.int32), suppress_token_ids=ids)


def reference(logits, prompt, outputs, params, suppress):
    """vLLM on one row: allowed ids, bad words and logit_bias, min_tokens suppression, then
    apply_penalties (vllm/model_executor/layers/utils.py)."""
    x = logits.astype(np.float32).copy()
    if params.allowed_token_ids is not None:
        keep = np.zeros(V, bool)
        keep[params.allowed_token_ids] = True
        x[~keep] = -np.inf
    for word in params.bad_words_token_ids:
        x[word[-1]] = -np.inf
    for t, b in (params.logit_bias or {}).items():
        x[t] += b
    x[suppress] = -np.inf
    counts = np.bincount(outputs, minlength=V)
    seen = (counts > 0) | np.isin(np.arange(V), prompt)
    rep = np.where(seen, np.float32(params.repetition_penalty), np.float32(1))
    x = np.where(x > 0, x / rep, x * rep)
    x -= np.float32(params.frequency_penalty) * counts
    x -= np.float32(params.presence_penalty) * (counts > 0)
    return x


def random_params(rng):
    kw = dict(presence_penalty=float(rng.uniform(-2, 2)), frequency_penalty=float(rng.uniform(-2, 2)),
              repetition_penalty=float(rng.uniform(0.5, 2)))
    if rng.random() < 0.5:
        kw["logit_bias"] = {int(t): float(rng.uniform(-5, 5)) for t in rng.integers(0, V, 5)}
    if rng.random() < 0.5:
        kw["allowed_token_ids"] = sorted({int(t) for t in rng.integers(0, V, 30)})
    params = SamplingParams(**kw)
    params._bad_words_token_ids = [[int(rng.integers(V))]] if rng.random() < 0.5 else None
    return params


def test_penalized_logits_match_vllm_semantics():
    rng = np.random.default_rng(0)
    fn = jax.jit(sampler.penalized_logits)
    for _ in range(5):
        state = penalties.init_state(S, V)
        logits = rng.standard_normal((R, V)).astype(np.float32) * 3
        slots = rng.permutation(S)[:R]
        rows = []
        for r in range(R - 1):  # the last row has no penalty row: it must stay untouched
            params = random_params(rng)
            prompt = [int(t) for t in rng.integers(0, V, rng.integers(1, 30))]
            outputs = [int(t) for t in rng.integers(0, V, rng.integers(0, 30))]
            state = penalties.set_row(state, slots[r], *penalties.build_row(params, prompt, outputs, V))
            rows.append((prompt, outputs, params))
        suppress = [[int(t) for t in rng.integers(0, V, 3)] for _ in range(R)]
        words = -(-V // 32)
        bitmask = np.full((R, words), -1, np.int32)
        bitmask[0] = rng.integers(-2**31, 2**31, words)  # a structured-output row
        pmd = PenaltyMetadata(token_bitmask=bitmask,
            slot=slots.astype(np.int32), commit_slot=slots.astype(np.int32),
            has_row=np.array([True] * (R - 1) + [False]),
            presence=np.array([p.presence_penalty for *_, p in rows] + [0], np.float32),
            frequency=np.array([p.frequency_penalty for *_, p in rows] + [0], np.float32),
            repetition=np.array([p.repetition_penalty for *_, p in rows] + [1], np.float32))
        got = np.asarray(fn(logits, make_md(R, V, suppress=suppress), state, pmd))
        allowed = np.unpackbits(bitmask.view(np.uint8), axis=1, bitorder="little")[:, :V] == 1
        for r, (prompt, outputs, params) in enumerate(rows):
            want = reference(logits[r], prompt, outputs, params, suppress[r])
            want[~allowed[r]] = -np.inf
            np.testing.assert_allclose(got[r], want, rtol=1e-5, atol=1e-5)
        plain = logits[-1].copy()
        plain[suppress[-1]] = -np.inf
        np.testing.assert_array_equal(got[-1], plain)


def test_sample_extended_counts_committed_tokens_and_returns_raw_logprobs():
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((R, V)).astype(np.float32)
    state = PenaltyState(output_counts=np.zeros((S, V), np.int32), prompt_mask=np.zeros((S, V), bool),
                         bias=np.zeros((S, V), np.float32))
    pmd = PenaltyMetadata(token_bitmask=np.full((R, -(-V // 32)), -1, np.int32),
                          slot=np.array([3, 1, 0, 0], np.int32), commit_slot=np.array([3, S, 0, S], np.int32),
                          has_row=np.array([True, True, False, False]),
                          presence=np.zeros(R, np.float32), frequency=np.zeros(R, np.float32),
                          repetition=np.full(R, 1.5, np.float32))
    md = make_md(R, V, temperature=[0, 1, 0, 0.7])
    fn = jax.jit(sampler.sample_extended, static_argnames="all_greedy")
    tokens, (token_lp, rank, top_ids, top_lp), new = fn(logits, md, state, pmd, all_greedy=False)
    tokens, counts = np.asarray(tokens), np.asarray(new.output_counts)
    expected = np.zeros((S, V), np.int32)
    expected[3, tokens[0]] += 1
    expected[0, tokens[2]] += 1
    np.testing.assert_array_equal(counts, expected)
    lp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))  # raw: no penalty, no temperature
    np.testing.assert_allclose(np.asarray(token_lp), lp[np.arange(R), tokens], atol=1e-5)
    np.testing.assert_array_equal(np.asarray(rank), (lp >= lp[np.arange(R), tokens][:, None]).sum(-1))
    order = np.argsort(-lp, axis=-1)[:, :MAX_LOGPROBS]
    np.testing.assert_array_equal(np.asarray(top_ids), order)
    np.testing.assert_allclose(np.asarray(top_lp), np.take_along_axis(lp, order, -1), atol=1e-5)
    assert tokens[0] == np.argmax(logits[0]) and rank[0] == 1  # no row counts yet: plain greedy


def suppressed_after(outputs, bad_words, min_tokens=0):
    """What the persistent batch suppresses for a request with `outputs` generated so far."""
    params = SamplingParams(min_tokens=min_tokens, stop_token_ids=[9], max_tokens=50)
    params._bad_words_token_ids = bad_words
    batch = InputBatch(max_num_seqs=2, max_model_len=16, max_pages_per_seq=1)
    batch.update_states(SchedulerOutput([NewRequestData("r", [5, 6], outputs, params, 0, 2, ([1],), 0)],
                                        CachedRequestData(), {}, 0, set(), set()))
    return batch.suppressed_ids(batch.requests["r"])


def test_bad_words_ban_the_last_token_once_the_rest_ends_the_output():
    words = [[7], [1, 2], [3, 4, 5]]  # [7] lives in the bias row, not here
    assert suppressed_after([], words) == []
    assert suppressed_after([1], words) == [2]
    assert suppressed_after([3, 4], words) == [5]
    assert suppressed_after([4, 4], words) == []
    assert suppressed_after([3, 4, 1], words) == [2]
    assert suppressed_after([1], words, min_tokens=3) == [9, 2, 2]  # stop ids + EOS, then the word


@pytest.mark.parametrize("kwargs, field", [
    (dict(repetition_penalty=0.0), "repetition_penalty"),
    (dict(presence_penalty=2.5), "presence_penalty"),
    (dict(frequency_penalty=-3.0), "frequency_penalty"),
    (dict(logit_bias={-1: 1.0}), "logit_bias"),
    (dict(logit_bias={"x": 1.0}), "logit_bias"),
    (dict(allowed_token_ids=[]), "allowed_token_ids"),
    (dict(bad_words=[""]), "bad_words"),
    (dict(logprobs=MAX_LOGPROBS + 1), "logprobs"),
    (dict(prompt_logprobs=-1), "prompt_logprobs"),
    (dict(n=0), "n"),
])
def test_bad_values_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=f"^{field} must"):
        SamplingParams(**kwargs)


def test_logit_bias_is_clamped_and_keyed_by_int():
    assert SamplingParams(logit_bias={"3": 500, 4: -200.0}).logit_bias == {3: 100.0, 4: -100.0}
