"""The rejection sampler run directly on synthetic logits: greedy keeps the longest prefix of
drafts equal to the target's argmax plus one token; random sampling with deterministic
(n-gram) drafts keeps the target distribution, position by position (chi-square over 24,000
seeded rows of an 8-token vocabulary, temperature 1, with and without top_p)."""
from __future__ import annotations

import jax
import numpy as np
import pytest
from scipy.stats import chisquare

from jaxvllm.worker.sampler import SamplingMetadata
from jaxvllm.worker.spec_decode.rejection_sampler import PLACEHOLDER, rejection_sample

V, K = 8, 2


def metadata(R: int, temperature: float, top_p: float = 1.0, seed0: int = 0) -> SamplingMetadata:
    seeds = np.arange(seed0, seed0 + R, dtype=np.uint64)
    return SamplingMetadata(
        temperature=np.full(R, temperature, np.float32), top_k=np.zeros(R, np.int32),
        top_p=np.full(R, top_p, np.float32), min_p=np.zeros(R, np.float32),
        seed=np.stack([(seeds >> 32).astype(np.uint32), (seeds & 0xFFFFFFFF).astype(np.uint32)], axis=1),
        step=np.full(R, 5, np.int32), suppress_token_ids=np.full((R, 8), V, np.int32))


def test_greedy_accepts_the_longest_matching_prefix_then_the_argmax():
    logits = np.full((4, K + 1, V), -1.0, np.float32)
    argmax = np.array([[3, 4, 5], [3, 4, 5], [3, 4, 5], [6, 1, 2]])
    np.put_along_axis(logits, argmax[..., None], 2.0, axis=-1)
    drafts = np.array([[3, 4], [3, 7], [0, 4], [6, 1]], np.int32)
    num_drafts = np.array([2, 2, 2, 1], np.int32)  # the last row drafted one token only
    for all_greedy in (True, False):  # the random variant's greedy rows too
        tokens, n = jax.jit(rejection_sample, static_argnums=(4, 5))(
            logits, drafts, num_drafts, metadata(4, 0.0), all_greedy, False)
        assert np.asarray(n).tolist() == [3, 2, 1, 2]
        assert np.asarray(tokens).tolist() == [[3, 4, 5], [3, 4, PLACEHOLDER], [3, PLACEHOLDER, PLACEHOLDER],
                                               [6, 1, PLACEHOLDER]]


# Logits of the three positions: after the last token, after draft 0, after draft 1.
LOGITS = np.log(np.array([[0.30, 0.05, 0.25, 0.10, 0.02, 0.08, 0.15, 0.05],
                          [0.05, 0.40, 0.05, 0.20, 0.10, 0.10, 0.05, 0.05],
                          [0.12, 0.12, 0.12, 0.12, 0.13, 0.13, 0.13, 0.13]], np.float32))
DRAFTS = np.array([2, 3], np.int32)  # plausible but not the most likely tokens


def target(position: int, top_p: float) -> np.ndarray:
    """The target distribution at a position: top_p's nucleus (vLLM's rule: keep a token while
    the mass above it is below top_p; tokens tied with the last one kept stay too), renormalized."""
    p = np.exp(LOGITS[position].astype(np.float64))
    p /= p.sum()
    order = np.argsort(-p, kind="stable")
    above = np.concatenate([[0.0], np.cumsum(p[order])[:-1]])
    q = np.where(p >= p[order[above < top_p]].min(), p, 0.0)
    return q / q.sum()


@pytest.mark.parametrize("top_p", [1.0, 0.75])
def test_random_sampling_keeps_the_target_distribution(top_p):
    R = 24_000
    tokens, n = jax.jit(rejection_sample, static_argnums=(4, 5))(
        np.broadcast_to(LOGITS, (R, K + 1, V)), np.broadcast_to(DRAFTS, (R, K)), np.full(R, K, np.int32),
        metadata(R, 1.0, top_p), False, top_p < 1.0)
    tokens, n = np.asarray(tokens), np.asarray(n)
    assert (n >= 1).all() and (n <= K + 1).all()
    # Position 0 is distributed as p_0; given that draft 0 came out, position 1 as p_1; given
    # drafts 0 and 1, position 2 (the bonus token) as p_2.
    rows = np.ones(R, bool)
    for position in range(K + 1):
        expected = target(position, top_p)
        observed = np.bincount(tokens[rows, position], minlength=V)
        support = expected > 0
        assert observed[~support].sum() == 0  # nothing outside top_p's nucleus
        assert chisquare(observed[support], expected[support] * rows.sum()).pvalue > 0.01
        if position < K:
            rows &= tokens[:, position] == DRAFTS[position]
    # Acceptance happened and was not certain: both branches of the sampler were exercised.
    assert 0 < (n == 1).sum() < R and (n == K + 1).sum() > 0
