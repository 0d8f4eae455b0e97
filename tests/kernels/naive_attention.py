"""The tests' oracle for ragged paged attention: a naive per-sequence numpy loop in float64,
written to be obviously right rather than fast, and the poisoned batches every kernel is
checked on. Every cache element that no real token owns (layer 0, unused pages, the tails of
last pages) holds +-1e30 poison, and page tables are shuffled and padded with arbitrary page
ids, so any read outside a sequence's own first kv_len rows would show."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from hypothesis import strategies as st

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


def pages_before_window_dropped(args, window: int, chunk_tokens: int):
    """The batch as a sliding-window KV cache group leaves it: a sequence's pages wholly
    before its first query's window (rounded down to a kernel's chunk of chunk_tokens) were
    given back and now hold someone else's data, here NaN (an unused page), so a kernel that
    reads one returns NaN. A sequence's first page stays: the XLA kernel's padding tokens
    read their K/V from the first sequence's position 0 (in a sliding group's table, the
    null block, whose padding K/V are finite)."""
    q, cache, layer, kv_lens, page_indices, cu_q_lens, num_seqs = args
    cache, page_indices = np.array(cache), page_indices.copy()
    dropped = cache.shape[2] - 1  # build() leaves the last pages unused
    cache[:, :, dropped] = np.nan
    ps = cache.shape[3]
    for s in range(int(num_seqs[0])):
        first_q = int(kv_lens[s] - (cu_q_lens[s + 1] - cu_q_lens[s]))
        page_indices[s, 1:max(first_q - window + 1, 0) // chunk_tokens * chunk_tokens // ps] = dropped
    return q, jnp.asarray(cache), layer, kv_lens, page_indices, cu_q_lens, num_seqs


# A decode and a prefill chunk far past a 16-token window, each alone in its tiles.
PAST_WINDOW = [(1, 200), (10, 200)]


# ps=4, (decode_)pages_per_chunk=2 -> 8-token chunks: lengths 4/8/16 end on a page (and chunk)
# boundary, 5/9/17 are one past, 17 spans three chunks.
DECODE = [(1, 1), (1, 4), (1, 5), (1, 8), (1, 9), (1, 17)]
PREFILL = [(3, 3), (8, 8), (9, 9), (16, 16), (17, 17)]
MIXED = [(1, 9), (5, 12), (7, 7), (1, 16), (4, 17), (8, 8), (3, 20)]


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
