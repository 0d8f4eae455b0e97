"""The device sampler against a plain-numpy copy of vLLM V1's sampling semantics.

Random draws come from fixed seeds, so every statistical check is deterministic.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax import lax

from jaxvllm.worker import sampler
from jaxvllm.worker.sampler import SamplingMetadata
from jaxvllm.worker.sampling_inputs import sampler_variant, sampler_variants

sample = jax.jit(sampler.sample, static_argnames=("all_greedy", "top_k_top_p"))
processed_logits = jax.jit(sampler.processed_logits)


def make_md(rows, vocab, *, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=None,
            step=0, suppress=None):
    """Metadata for `rows` rows; each field is a scalar (all rows) or a per-row sequence.

    seed defaults to the row index; suppress is a per-row list of id lists, padded with
    vocab-size ids as the runner does."""
    full = lambda v, dtype: np.broadcast_to(np.asarray(v, dtype), (rows,)).copy()
    seeds = full(np.arange(rows) if seed is None else seed, np.uint64)
    suppress = suppress or [[] for _ in range(rows)]
    width = max(1, max(len(s) for s in suppress))
    ids = np.full((rows, width), vocab, np.int32)
    for r, s in enumerate(suppress):
        ids[r, :len(s)] = s
    return SamplingMetadata(
        temperature=jnp.asarray(full(temperature, np.float32)),
        top_k=jnp.asarray(full(top_k, np.int32)),
        top_p=jnp.asarray(full(top_p, np.float32)),
        min_p=jnp.asarray(full(min_p, np.float32)),
        seed=jnp.asarray(np.stack([seeds >> 32, seeds & 0xFFFFFFFF], 1).astype(np.uint32)),
        step=jnp.asarray(full(step, np.int32)),
        suppress_token_ids=jnp.asarray(ids))


def softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum()


def reference_allowed(logits, temperature, top_k, top_p, min_p, suppress=()):
    """vLLM V1 (sampler.py, MinPLogitsProcessor, apply_top_k_top_p) on one float32 row.

    Returns (allowed, near): the tokens left to sample from, and the tokens whose fate
    rests on a comparison within float rounding of its threshold (not compared)."""
    x = logits.astype(np.float32)
    vocab = x.size
    x[[i for i in suppress if i < vocab]] = -np.inf
    x = x / np.float32(temperature)
    near = np.zeros(vocab, bool)
    if min_p > 0:
        probs = softmax(x)
        threshold = np.float32(min_p) * probs.max()
        near |= np.isclose(probs, threshold, rtol=1e-4, atol=0)
        x[probs < threshold] = -np.inf
    order = np.argsort(x, kind="stable")
    srt = x[order]
    if 0 < top_k < vocab:
        srt[srt < srt[vocab - top_k]] = -np.inf
    if top_p < 1.0:
        cum = np.cumsum(softmax(srt))
        drop = cum <= np.float32(1 - top_p)
        drop[-1] = False
        near[order] |= np.abs(cum - (1 - top_p)) < 1e-5
        srt[drop] = -np.inf
    out = np.empty_like(x)
    out[order] = srt
    return np.isfinite(out), near


def cutoff_found_in_top_k(logits, md):
    """Whether the sampler's fast path (the _FAST_K largest logits) settles every row,
    i.e. whether it skips the full-sort fallback (no suppression in these batches)."""
    x = sampler._filter(jnp.asarray(logits), md.replace(top_k=jnp.zeros_like(md.top_k),
                                                        top_p=jnp.ones_like(md.top_p)))
    k = jnp.where((md.top_k <= 0) | (md.top_k >= x.shape[1]), 0, md.top_k)
    largest = lax.top_k(x, min(sampler._FAST_K, x.shape[1]))[0]
    return bool(sampler._cutoff_from(x, largest, k, md.top_p)[1].all())


def check_against_reference(logits, rows):
    """rows: per-row dicts of temperature/top_k/top_p/min_p/suppress."""
    md = make_md(len(rows), logits.shape[1], **{
        key: [r[key] for r in rows] for key in ("temperature", "top_k", "top_p", "min_p")},
        suppress=[r.get("suppress", []) for r in rows])
    got = np.isfinite(np.asarray(processed_logits(jnp.asarray(logits), md)))
    for r, params in enumerate(rows):
        want, near = reference_allowed(logits[r], **params)
        assert near.sum() <= 10, params
        np.testing.assert_array_equal(got[r][~near], want[~near], err_msg=str(params))
    return md


def test_greedy_is_argmax_with_and_without_the_static_flag():
    logits = np.random.default_rng(0).standard_normal((6, 1000)).astype(np.float32)
    md = make_md(6, 1000, temperature=0.0, top_k=3, top_p=0.5)
    for all_greedy in (True, False):
        np.testing.assert_array_equal(sample(logits, md, all_greedy=all_greedy), logits.argmax(1))


def test_greedy_rows_in_a_mixed_batch_return_argmax():
    logits = np.random.default_rng(1).standard_normal((8, 1000)).astype(np.float32)
    temps = [0.0, 1.0] * 4
    got = np.asarray(sample(logits, make_md(8, 1000, temperature=temps), all_greedy=False))
    np.testing.assert_array_equal(got[::2], logits[::2].argmax(1))
    assert (got[1::2] != logits[1::2].argmax(1)).any()  # the random rows really sample


def test_suppressed_ids_are_never_chosen_and_padding_ids_are_ignored():
    vocab = 50
    logits = np.zeros((4, vocab), np.float32)
    logits[:, :3] = 10.0  # ids 0-2 would win without suppression
    logits[:, 7] = 5.0
    suppress = [[0, 1, 2], [0, 1, 2, vocab, vocab + 1, 2**30], [vocab, 2**31 - 1], []]
    md = make_md(4, vocab, temperature=0.0, suppress=suppress)
    np.testing.assert_array_equal(sample(logits, md, all_greedy=True), [7, 7, 0, 0])
    # Random rows, many steps at once: one row per step, same logits.
    n = 400
    md = make_md(n, vocab, temperature=2.0, step=np.arange(n), seed=1,
                 suppress=[[0, 1, 2, vocab + 3]] * n)
    got = np.asarray(sample(np.repeat(logits[:1], n, 0), md, all_greedy=False))
    assert not np.isin(got, [0, 1, 2]).any()
    assert len(set(got.tolist())) > 10


@pytest.mark.parametrize("vocab, scale, fast", [(50, 1.0, True), (1000, 4.0, True), (1000, 0.5, False)])
def test_filters_match_vllm_reference(vocab, scale, fast):
    """One batch mixing every filter combination, so per-row parameters never leak.

    With vocab 1000 and flat logits some cutoffs lie deeper than the 256 largest
    logits, which exercises the full-sort fallback; peaked logits stay on the fast path."""
    combos = [dict(temperature=t, top_k=k, top_p=p, min_p=m)
              for t in (0.7, 1.3) for k in (-1, 0, 1, 40, 200, vocab, vocab + 7)
              for p in (1.0, 0.9, 0.5) for m in (0.0, 0.1)]
    logits = (np.random.default_rng(vocab).standard_normal((len(combos), vocab)) * scale
              ).astype(np.float32)
    md = check_against_reference(logits, combos)
    assert cutoff_found_in_top_k(logits, md) == fast


def test_top_k_beyond_the_fast_path_matches_reference():
    logits = np.random.default_rng(3).standard_normal((3, 1000)).astype(np.float32)
    md = check_against_reference(logits, [dict(temperature=1.0, top_k=k, top_p=1.0, min_p=0.0)
                                          for k in (300, 999, 50)])
    assert not cutoff_found_in_top_k(logits, md)


@settings(max_examples=25, deadline=None, derandomize=True, database=None)
@given(st.lists(st.fixed_dictionaries(dict(
    temperature=st.floats(0.2, 3.0), top_k=st.sampled_from([-1, 0, 1, 2, 5, 50, 300, 999]),
    top_p=st.sampled_from([1.0, 0.99, 0.9, 0.6, 0.2, 0.01]),
    min_p=st.sampled_from([0.0, 0.01, 0.2, 0.9]),
    suppress=st.lists(st.integers(0, 1100), max_size=4))), min_size=4, max_size=4),
    st.floats(0.1, 8.0), st.integers(0, 2**32 - 1))
def test_filters_match_vllm_reference_on_random_combinations(rows, scale, seed):
    logits = (np.random.default_rng(seed).standard_normal((4, 1000)) * scale).astype(np.float32)
    check_against_reference(logits, rows)


def test_sampled_tokens_come_from_the_allowed_set_and_cover_it():
    vocab, n = 300, 512
    logits = np.random.default_rng(4).standard_normal(vocab).astype(np.float32)
    for params in (dict(top_k=6, top_p=1.0, min_p=0.0), dict(top_k=0, top_p=0.3, min_p=0.0),
                   dict(top_k=20, top_p=0.8, min_p=0.3)):
        allowed, near = reference_allowed(logits, 1.0, **params)
        assert not near.any()
        md = make_md(n, vocab, step=np.arange(n), seed=7, **params)
        got = np.asarray(sample(np.tile(logits, (n, 1)), md, all_greedy=False))
        assert set(got.tolist()) == set(np.flatnonzero(allowed).tolist()), params


@pytest.mark.parametrize("filters", [True, False])
def test_host_chosen_variants_draw_what_the_device_chosen_one_draws(filters):
    """GPU and TPU steps run the variant the host picks (no lax.cond; top_k/top_p from a full
    sort): the same tokens as the CPU's on-device choice, deep cutoffs included."""
    vocab, rows = 1000, 8
    logits = np.random.default_rng(6).standard_normal((rows, vocab)).astype(np.float32)
    top_k, top_p = (0, 1.0)
    if filters:  # deep cutoffs (300, 999, 0.99) included
        top_k, top_p = [0, 5, 300, 999, -1, 0, 40, 0], [1.0, 1.0, 0.99, 1.0, 0.5, 0.9, 0.6, 1.0]
    md = make_md(rows, vocab, temperature=np.where(np.arange(rows) == 7, 0.0, 0.8), top_k=top_k, top_p=top_p,
                 step=np.arange(rows), min_p=0.01)
    variant = sampler_variant(jax.device_get(md), False, vocab, step_may_branch=False)
    assert variant == dict(all_greedy=False, top_k_top_p=filters)
    assert variant in sampler_variants(step_may_branch=False)
    np.testing.assert_array_equal(sample(logits, md, **variant), sample(logits, md, all_greedy=False))


def test_same_seed_and_step_give_the_same_token_in_any_batch():
    vocab = 1000
    rng = np.random.default_rng(5)
    row = rng.standard_normal(vocab).astype(np.float32)
    seed, big = 2**62 + 12345, 2**63 - 1
    tokens = []
    for rows, pos in ((1, 0), (3, 2), (8, 5), (16, 0)):
        logits = rng.standard_normal((rows, vocab)).astype(np.float32)
        logits[pos] = row
        seeds = rng.integers(0, big, rows, dtype=np.uint64)
        seeds[pos] = seed
        temps, top_p = rng.choice([0.0, 0.5, 1.0], rows), rng.choice([1.0, 0.3], rows)
        temps[pos], top_p[pos] = 0.9, 0.95
        steps = rng.integers(0, 100, rows)
        steps[pos] = 17
        md = make_md(rows, vocab, temperature=temps, top_p=top_p, seed=seeds, step=steps)
        tokens.append(int(sample(logits, md, all_greedy=False)[pos]))
    assert len(set(tokens)) == 1, tokens


def test_different_seeds_and_steps_give_different_tokens():
    vocab, n = 1000, 64
    logits = np.zeros((n, vocab), np.float32)  # uniform: collisions are rare
    by_seed = sample(logits, make_md(n, vocab, seed=np.arange(n) + 99), all_greedy=False)
    by_step = sample(logits, make_md(n, vocab, seed=99, step=np.arange(n)), all_greedy=False)
    high_word = sample(logits, make_md(n, vocab, seed=(np.arange(n, dtype=np.uint64) << 32) + 99),
                       all_greedy=False)
    for got in (by_seed, by_step, high_word):
        assert len(set(np.asarray(got).tolist())) > n // 2


@pytest.mark.parametrize("vary", ["step", "seed"])
@pytest.mark.parametrize("params", [dict(temperature=0.7), dict(temperature=1.5, top_k=4),
                                    dict(temperature=1.0, top_p=0.8, min_p=0.05)])
def test_frequencies_match_the_softmax(params, vary):
    vocab, n = 8, 20000
    logits = np.array([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0], np.float32)
    allowed, _ = reference_allowed(logits, **{"top_k": 0, "top_p": 1.0, "min_p": 0.0, **params})
    want = softmax(np.where(allowed, logits / params["temperature"], -np.inf))
    draws = dict(step=np.arange(n), seed=123) if vary == "step" else dict(seed=np.arange(n) * 7919)
    md = make_md(n, vocab, **draws, **params)
    got = np.bincount(np.asarray(sample(np.tile(logits, (n, 1)), md, all_greedy=False)),
                      minlength=vocab) / n
    np.testing.assert_allclose(got, want, atol=0.015)
    assert (got[~allowed] == 0).all()


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="checks XLA:CPU's lowering")
def test_cpu_lowering_keeps_the_fast_top_k_kernel():
    """Guards a silent ~1 s/step regression: XLA:CPU turns lax.top_k into a full float
    sort when later slices merge into its sort + slice pattern."""
    vocab = 49152
    md = make_md(4, vocab, top_p=0.9)
    hlo = sample.lower(jnp.zeros((4, vocab)), md, all_greedy=False).compile().as_text()
    assert 'custom_call_target="TopK"' in hlo
    assert not [line for line in hlo.splitlines() if " f32[4,49152]{1,0} sort(" in line]
