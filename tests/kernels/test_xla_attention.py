"""The XLA attention backend (jaxvllm/kernels/xla) against the naive oracle
(naive_attention.py), with its tiling knobs small enough that short batches cross blocks."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from naive_attention import (
    DECODE,
    MIXED,
    PAST_WINDOW,
    PREFILL,
    assert_matches_naive,
    batches,
    build,
    pages_before_window_dropped,
)

from jaxvllm.kernels.xla.ragged_paged_attention import ragged_paged_attention


def check(args, tol=1e-5, **kw):
    kw.setdefault("sm_scale", args[0].shape[-1] ** -0.5)
    opts = {k: w for k, w in kw.items() if k not in ("pages_per_chunk", "decode_pages_per_chunk", "token_block",
                                                      "query_block")}
    assert_matches_naive(ragged_paged_attention(*args, **kw), args, tol, **opts)


@pytest.mark.parametrize("seqs,nq,nkv,hd,ppc", [
    (DECODE, 4, 4, 64, 2),
    (DECODE, 8, 2, 128, 8),
    (PREFILL, 6, 2, 128, 2),
    (PREFILL, 4, 1, 64, 8),
    (MIXED, 8, 2, 64, 2),
    (MIXED, 3, 1, 128, 2),
], ids=["decode-r1-d64", "decode-r4-d128-1chunk", "prefill-r3-d128", "prefill-r4-d64-1chunk",
        "mixed-r4-d64", "mixed-r3-d128"])
def test_matches_naive(seqs, nq, nkv, hd, ppc):
    check(build(np.random.default_rng(len(seqs) * nq + hd), seqs, nq=nq, nkv=nkv, hd=hd),
          pages_per_chunk=ppc, decode_pages_per_chunk=ppc)


@pytest.mark.parametrize("seqs", [MIXED, PREFILL + [(1, 20), (13, 21)]], ids=["mixed", "prefill"])
def test_small_tiles(seqs):
    # Query blocks of 3 rows straddle sequences and the end of the token axis; token blocks
    # of 2 mix decode tokens with prefill tokens and padding.
    args = build(np.random.default_rng(11), seqs, nq=4, nkv=2, hd=64)
    check(args, pages_per_chunk=2, query_block=3, token_block=2)
    check(args, sliding_window=6, pages_per_chunk=1, decode_pages_per_chunk=1, query_block=5,
          token_block=3)


@pytest.mark.parametrize("window,cap", [(5, None), (None, 2.0), (3, 5.0), (12, None)])
def test_sliding_window_and_soft_cap(window, cap):
    args = build(np.random.default_rng(7), MIXED, nq=4, nkv=2, hd=64)
    args = (args[0] * 3,) + args[1:]  # larger scores so the cap bites
    check(args, sliding_window=window, soft_cap=cap, pages_per_chunk=2)


def test_pages_before_the_window_are_not_read():
    """Decode and prefill parts start at the first chunk of pages the window reaches: the
    pages before it (given back by a sliding group, NaN here) are never read."""
    args = pages_before_window_dropped(build(np.random.default_rng(5), PAST_WINDOW, nq=4, nkv=2, hd=64),
                                    window=16, chunk_tokens=2 * 4)
    check(args, sliding_window=16, pages_per_chunk=2, decode_pages_per_chunk=2)


def test_bfloat16():
    args = build(np.random.default_rng(3), MIXED, nq=8, nkv=2, hd=128, dtype=jnp.bfloat16)
    out = ragged_paged_attention(*args, sm_scale=128 ** -0.5, pages_per_chunk=2)
    assert out.dtype == jnp.bfloat16
    check(args, tol=2e-2, pages_per_chunk=2)


def test_all_padding_step_gives_zeros():
    # Warmup shape: num_seqs == 0, every array zero.
    rng = np.random.default_rng(0)
    args = build(rng, [], nq=4, nkv=2, hd=64, pad_seqs=3, pad_tokens=5, pages_per_seq=3, num_pages=4)
    args = args[:3] + (np.zeros(3, np.int32), np.zeros((3, 3), np.int32), np.zeros(4, np.int32)) + args[6:]
    out = np.asarray(ragged_paged_attention(*args, sm_scale=0.125, pages_per_chunk=2))
    assert out.shape == (5, 4, 64) and not out.any()


@settings(max_examples=12, derandomize=True, deadline=None)
@given(seqs=batches(), seed=st.integers(0, 2**16))
def test_random_batches(seqs, seed):
    # Fixed shapes (one compile): 4 seq slots, 6 pages/seq, 32 tokens.
    args = build(np.random.default_rng(seed), seqs, nq=6, nkv=2, hd=64, pad_seqs=4 - len(seqs),
                 num_tokens=32, pages_per_seq=6, num_pages=1 + 4 * 6 + 2)
    check(args, pages_per_chunk=2, query_block=5)
