"""ragged_paged_attention (pallas_kernels/reference.py) against a naive per-sequence numpy
loop, and write_kv (jaxvllm/layers/attention.py) against its contract.

Every cache element that no real token owns (layer 0, unused pages, the tails of last pages)
holds +-1e30 poison, and page tables are shuffled and padded with arbitrary page ids, so any
read outside a sequence's own first kv_len rows would show."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxvllm.layers.attention import write_kv
from pallas_kernels.reference import ragged_paged_attention

POISON = 1e30
LAYER = 1


def poison(rng, shape):
    return np.where(rng.random(shape) < 0.5, -POISON, POISON).astype(np.float32)


def build(rng, seqs, *, nq, nkv, hd, ps=4, pad_seqs=2, pad_tokens=3, num_tokens=None,
          pages_per_seq=None, num_pages=None, dtype=np.float32):
    """seqs: [(q_len, kv_len)] of the real sequences; returns the kernel's positional args."""
    need = [-(-kv // ps) for _, kv in seqs]
    pages_per_seq = pages_per_seq or max(need, default=0) + 1
    num_pages = num_pages or 1 + sum(need) + 3
    max_seqs = len(seqs) + pad_seqs
    total_q = sum(q for q, _ in seqs)
    num_tokens = num_tokens or total_q + pad_tokens
    cache = poison(rng, (2, 2, num_pages, ps, nkv, hd))
    perm = rng.permutation(np.arange(1, num_pages))  # non-contiguous, page 0 is the null block
    page_indices = rng.integers(0, num_pages, (max_seqs, pages_per_seq)).astype(np.int32)
    kv_lens = np.zeros(max_seqs, np.int32)
    cu_q_lens = np.full(max_seqs + 1, total_q, np.int32)
    cu_q_lens[0], used = 0, 0
    for s, ((q_len, kv), n) in enumerate(zip(seqs, need)):
        pages = perm[used:used + n]
        used += n
        page_indices[s, :n] = pages
        pos = np.arange(kv)
        cache[LAYER, :, pages[pos // ps], pos % ps] = rng.standard_normal((kv, 2, nkv, hd))
        kv_lens[s] = kv
        cu_q_lens[s + 1] = cu_q_lens[s] + q_len
    q = rng.standard_normal((num_tokens, nq, hd)).astype(np.float32)
    return (jnp.asarray(q, dtype), jnp.asarray(cache, dtype), jnp.int32(LAYER), kv_lens,
            page_indices, cu_q_lens, np.array([len(seqs)], np.int32))


def naive(q, cache, layer, kv_lens, page_indices, cu_q_lens, num_seqs, *, sm_scale,
          sliding_window=None, soft_cap=None):
    q, cache = np.asarray(q, np.float64), np.asarray(cache, np.float64)
    nq, ps, nkv = q.shape[1], cache.shape[3], cache.shape[4]
    group = nq // nkv
    out = np.zeros_like(q)
    for s in range(int(num_seqs[0])):
        kv_len, lo, hi = int(kv_lens[s]), int(cu_q_lens[s]), int(cu_q_lens[s + 1])
        rows = [(page_indices[s, j // ps], j % ps) for j in range(kv_len)]
        k = np.stack([cache[layer, 0, p, o] for p, o in rows])  # [kv_len, nkv, hd]
        v = np.stack([cache[layer, 1, p, o] for p, o in rows])
        for t in range(lo, hi):
            pos = kv_len - (hi - lo) + (t - lo)
            keep = np.arange(pos + 1)
            if sliding_window is not None:
                keep = keep[keep > pos - sliding_window]
            for h in range(nq):
                sc = k[keep, h // group] @ q[t, h] * sm_scale
                if soft_cap is not None:
                    sc = soft_cap * np.tanh(sc / soft_cap)
                p = np.exp(sc - sc.max())
                out[t, h] = (p / p.sum()) @ v[keep, h // group]
    return out


def assert_matches_naive(got, args, tol, **kw):
    """A kernel's output against `naive` (kw: its sm_scale, sliding_window, soft_cap); padding
    tokens must come out as zeros. Shared by the reference, Pallas and native kernel tests."""
    got = np.asarray(got, np.float64)
    assert got.shape == args[0].shape
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, naive(*args, **kw), rtol=tol, atol=tol)
    end = int(args[5][int(args[6][0])])
    assert not got[end:].any(), "padding tokens must produce zeros"


def check(args, tol=1e-5, **kw):
    kw.setdefault("sm_scale", args[0].shape[-1] ** -0.5)
    opts = {k: w for k, w in kw.items() if k not in ("pages_per_chunk", "decode_pages_per_chunk", "token_block",
                                                      "query_block")}
    assert_matches_naive(ragged_paged_attention(*args, **kw), args, tol, **opts)


# ps=4, (decode_)pages_per_chunk=2 -> 8-token chunks: lengths 4/8/16 end on a page (and chunk)
# boundary, 5/9/17 are one past, 17 spans three chunks.
DECODE = [(1, 1), (1, 4), (1, 5), (1, 8), (1, 9), (1, 17)]
PREFILL = [(3, 3), (8, 8), (9, 9), (16, 16), (17, 17)]
MIXED = [(1, 9), (5, 12), (7, 7), (1, 16), (4, 17), (8, 8), (3, 20)]


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


@st.composite
def batches(draw, max_seqs=4, max_kv=24, num_tokens=32):
    seqs, budget = [], num_tokens
    for _ in range(draw(st.integers(1, max_seqs))):
        kv = draw(st.integers(1, max_kv))
        q_len = draw(st.sampled_from([1, kv, draw(st.integers(1, kv))]))
        if q_len > budget:
            break
        seqs.append((q_len, kv))
        budget -= q_len
    return seqs


@settings(max_examples=12, derandomize=True, deadline=None)
@given(seqs=batches(), seed=st.integers(0, 2**16))
def test_random_batches(seqs, seed):
    # Fixed shapes (one compile): 4 seq slots, 6 pages/seq, 32 tokens.
    args = build(np.random.default_rng(seed), seqs, nq=6, nkv=2, hd=64, pad_seqs=4 - len(seqs),
                 num_tokens=32, pages_per_seq=6, num_pages=1 + 4 * 6 + 2)
    check(args, pages_per_chunk=2, query_block=5)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_write_kv_writes_exactly_its_slots(dtype):
    rng = np.random.default_rng(1)
    layers, pages, ps, nkv, hd, n = 3, 6, 4, 2, 8, 7
    cache = jnp.asarray(rng.standard_normal((layers, 2, pages, ps, nkv, hd)), dtype)
    slots = rng.permutation(pages * ps)[:n].astype(np.int32)
    k = rng.standard_normal((n, nkv, hd)).astype(np.float32)
    v = rng.standard_normal((n, nkv, hd)).astype(np.float32)
    got = np.asarray(write_kv(cache, jnp.int32(1), jnp.asarray(k), jnp.asarray(v), slots), np.float32)
    want = np.asarray(cache, np.float32).copy()
    for t, slot in enumerate(slots):
        want[1, 0, slot // ps, slot % ps] = np.asarray(jnp.asarray(k[t], dtype), np.float32)
        want[1, 1, slot // ps, slot % ps] = np.asarray(jnp.asarray(v[t], dtype), np.float32)
    assert got.dtype == np.float32 and write_kv(cache, 1, k, v, slots).dtype == dtype
    np.testing.assert_array_equal(got, want)
