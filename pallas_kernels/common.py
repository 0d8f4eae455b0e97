"""What both Pallas kernels share: the work list that maps a static grid onto a ragged
batch, and the masked online-softmax update.

The flat token axis is cut into fixed blocks of `block_q` tokens. A work item is one
(token block, sequence) pair whose token ranges overlap, in block order; tokens of a block
that belong to other sequences are masked out for that item. Blocks holding only padding
get one item with sequence -1 (their output is zeros), and the list is padded to its
static upper bound `num_blocks + max_num_seqs` with no-op items on the last block. Each
sequence of q_len tokens costs ceil(q_len / block_q) (+1 when it straddles a block
boundary) items, so decode, prefill and mixed steps share one grid without a per-sequence
worst case.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)


def work_list(cu_q_lens: jax.Array, num_seqs: jax.Array, num_tokens: int, block_q: int
              ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(block, seq, first) int32 arrays of length num_blocks + max_num_seqs; `first` marks
    the first item of each block (the TPU kernel zeroes its resident output block there)."""
    max_num_seqs = cu_q_lens.shape[0] - 1
    num_blocks = -(-num_tokens // block_q)
    n = num_seqs[0]
    seq_ids = jnp.arange(max_num_seqs, dtype=jnp.int32)
    start, end = cu_q_lens[:-1], cu_q_lens[1:]
    first_block, end_block = start // block_q, (end + block_q - 1) // block_q
    count = jnp.where((seq_ids < n) & (end > start), end_block - first_block, 0)
    incl = jnp.cumsum(count)
    excl = incl - count
    total = incl[-1]
    covered = (cu_q_lens[n] + block_q - 1) // block_q  # blocks holding real tokens

    j = jnp.arange(num_blocks + max_num_seqs, dtype=jnp.int32)
    # compare_all: one fused comparison; the default binary search is a while loop, which on
    # a GPU launches kernels per iteration on every attention call.
    seq = jnp.minimum(jnp.searchsorted(incl, j, side="right", method="compare_all"),
                      max_num_seqs - 1).astype(jnp.int32)
    is_seq = j < total
    is_empty = (j >= total) & (j < total + num_blocks - covered)
    block = jnp.where(is_seq, first_block[seq] + j - excl[seq],
                      jnp.where(is_empty, covered + j - total, num_blocks - 1))
    seq = jnp.where(is_seq, seq, -1)
    first = jnp.concatenate([jnp.ones(1, bool), block[1:] != block[:-1]])
    return block.astype(jnp.int32), seq, first.astype(jnp.int32)


def layer_and_window(layer, sliding_window) -> jax.Array:
    """i32[2]: the layer to read and its sliding window (0: none), the kernels' first scalar
    operand. The window is a value, not a compile-time constant, so a step whose layers differ
    in window runs one kernel for all of them."""
    window = 0 if sliding_window is None else sliding_window
    return jnp.stack([jnp.asarray(layer, jnp.int32).reshape(()), jnp.asarray(window, jnp.int32).reshape(())])


def kv_range(q_first_pos, q_last_pos, sliding_window):
    """[lo, hi) of the KV positions that query positions q_first..q_last can see;
    sliding_window: None, or a (traced) window, <= 0 for none."""
    lo = 0 if sliding_window is None else jnp.where(
        sliding_window > 0, jnp.maximum(q_first_pos - sliding_window + 1, 0), 0)
    return lo, q_last_pos + 1


def attention_mask(q_pos, kv_pos, row_valid, sliding_window):
    """[rows, cols] causal (+ window) mask from query positions and row validity [rows, 1]
    and KV positions [1, cols] (2-D throughout: TPUs keep rows on sublanes)."""
    mask = row_valid & (kv_pos <= q_pos)
    if sliding_window is not None:
        mask &= (sliding_window <= 0) | (kv_pos > q_pos - sliding_window)
    return mask


def softmax_update(s, mask, m_prev, l_prev, acc_prev, v, *, soft_cap: float | None, precision):
    """One online-softmax step over a KV block: s [rows, cols] f32 raw scores (already
    scaled), v [cols, head_dim]; returns new (m, l, acc) with m, l [rows, 1] and acc
    [rows, head_dim]. Masked scores contribute exactly zero, so poisoned or stale KV rows
    outside the mask never leak in."""
    if soft_cap is not None:
        s = soft_cap * jnp.tanh(s / soft_cap)
    s = jnp.where(mask, s, MASK_VALUE)
    m_new = jnp.maximum(m_prev, s.max(axis=-1, keepdims=True))
    p = jnp.where(mask, jnp.exp(s - m_new), 0.0)
    alpha = jnp.exp(m_prev - m_new)
    pv = jax.lax.dot_general(p.astype(v.dtype), v, (((1,), (0,)), ((), ())),
                             precision=precision, preferred_element_type=jnp.float32)
    return m_new, alpha * l_prev + p.sum(axis=-1, keepdims=True), alpha * acc_prev + pv


def qk(q, k, precision):
    """q [rows, d] . k [cols, d]^T in float32."""
    return jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())), precision=precision,
                               preferred_element_type=jnp.float32)


def as_elements(x, kv_dtype):
    """Loaded cache elements in their dtype: a cache stored as bits (uint8) holds kv_dtype
    elements (an fp8 cache on a CPU, whose XLA cannot update fp8 in place); else x."""
    return x if kv_dtype is None else jax.lax.bitcast_convert_type(x, kv_dtype)


def precision_for(dtype) -> jax.lax.Precision:
    """Full float32 matmuls for float32 inputs (TF32 would miss the 1e-5 tolerance)."""
    return jax.lax.Precision.HIGHEST if jnp.dtype(dtype) == jnp.float32 else jax.lax.Precision.DEFAULT
