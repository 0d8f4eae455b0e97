"""Ragged paged attention in plain jax.numpy: ground truth for the Pallas kernels and
the CPU backend of the model.

One call serves decode-only, prefill-only and mixed steps. Queries are a flat token axis;
sequence s owns tokens cu_q_lens[s]:cu_q_lens[s+1], which are the *last* tokens of its
kv_lens[s] tokens of context (their K/V are already written to the pages). Tokens past
cu_q_lens[num_seqs] are padding and produce zeros.

The cache is the engine's layer-stacked array, read at `layer`: gathering pages straight
from it avoids materializing a copy of the layer's slice.

Attention is computed in two parts merged by their softmax statistics, because XLA on CPU
runs large matmuls well and per-token small ones badly:
- the step's own tokens attend to each other with one dense, masked [tokens x tokens]
  matmul per KV head (all of a fresh prefill's work);
- each token attends to its sequence's context cached before this step, a block of tokens
  and a chunk of pages at a time with an online softmax; both trip counts are dynamic, so
  padding tokens and tokens without cached context (fresh prefills) cost nothing.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

_MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)


@functools.partial(jax.jit, static_argnames=("sm_scale", "sliding_window", "soft_cap",
                                             "pages_per_chunk", "token_block"))
def ragged_paged_attention(
    q: jax.Array,             # [num_tokens, num_q_heads, head_dim]
    kv_cache: jax.Array,      # [num_layers, 2 (K, V), num_pages, page_size, num_kv_heads, head_dim]
    layer: jax.Array,         # i32[]: which layer of kv_cache to read
    kv_lens: jax.Array,       # i32[max_num_seqs]
    page_indices: jax.Array,  # i32[max_num_seqs, pages_per_seq]
    cu_q_lens: jax.Array,     # i32[max_num_seqs + 1]
    num_seqs: jax.Array,      # i32[1]
    *,
    sm_scale: float,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
    pages_per_chunk: int = 8,
    token_block: int = 16,
) -> jax.Array:
    num_tokens, num_q_heads, head_dim = q.shape
    page_size, num_kv_heads = kv_cache.shape[3], kv_cache.shape[4]
    group = num_q_heads // num_kv_heads
    pages_per_seq = page_indices.shape[1]
    chunk = pages_per_chunk * page_size
    num_chunks_max = -(-pages_per_seq // pages_per_chunk)
    page_indices = jnp.pad(page_indices, ((0, 0), (0, num_chunks_max * pages_per_chunk - pages_per_seq)))

    # Which sequence each token belongs to, its position, and the context cached before it.
    token = jnp.arange(num_tokens, dtype=jnp.int32)
    seq = jnp.searchsorted(cu_q_lens[1:], token, side="right").astype(jnp.int32)
    valid = token < cu_q_lens[num_seqs[0]]
    seq = jnp.where(valid, seq, 0)
    q_pos = jnp.where(valid, kv_lens[seq] - (cu_q_lens[seq + 1] - token), 0)
    cached_len = jnp.where(valid, kv_lens[seq] - (cu_q_lens[seq + 1] - cu_q_lens[seq]), 0)
    seq_pages = page_indices[seq]  # [num_tokens, padded pages]

    qg = q.astype(jnp.float32).reshape(num_tokens, num_kv_heads, group, head_dim) * sm_scale

    def scores(s, mask):
        if soft_cap is not None:
            s = soft_cap * jnp.tanh(s / soft_cap)
        return jnp.where(mask, s, _MASK_VALUE)

    def in_window(kv_pos, q_pos):
        return True if sliding_window is None else kv_pos > q_pos - sliding_window

    # Part 1: the step's own tokens, read back from their slots.
    new_kv = kv_cache[layer, :, seq_pages[token, q_pos // page_size], q_pos % page_size]
    new_kv = new_kv.astype(jnp.float32)  # [tokens, 2, kv_heads, head_dim]
    mask = (valid[:, None] & valid[None, :] & (seq[:, None] == seq[None, :])
            & (q_pos[None, :] <= q_pos[:, None]) & in_window(q_pos[None, :], q_pos[:, None]))
    s = scores(jnp.einsum("tkgd,ukd->tkgu", qg, new_kv[:, 0]), mask[:, None, None, :])
    m = s.max(axis=-1)
    p = jnp.where(mask[:, None, None, :], jnp.exp(s - m[..., None]), 0.0)
    l = p.sum(axis=-1)
    acc = jnp.einsum("tkgu,ukd->tkgd", p, new_kv[:, 1])

    # Part 2: the context cached before this step, for blocks of tokens (padding blocks
    # and blocks without cached context, like fresh prefills, cost nothing), a chunk of
    # pages at a time.
    block = min(token_block, num_tokens)

    def chunk_step(b, c, carry):
        m, l, acc = carry
        rows = jax.lax.dynamic_slice_in_dim(seq_pages, b * block, block)
        pages = jax.lax.dynamic_slice_in_dim(rows, c * pages_per_chunk, pages_per_chunk, axis=1)
        kv = kv_cache[layer, :, pages].astype(jnp.float32)  # [block, pages, 2, page_size, ...]
        k = kv[:, :, 0].reshape(block, chunk, num_kv_heads, head_dim)
        v = kv[:, :, 1].reshape(block, chunk, num_kv_heads, head_dim)
        kv_pos = c * chunk + jnp.arange(chunk, dtype=jnp.int32)
        cached = jax.lax.dynamic_slice_in_dim(cached_len, b * block, block)
        pos = jax.lax.dynamic_slice_in_dim(q_pos, b * block, block)
        mask = (kv_pos[None, :] < cached[:, None]) & in_window(kv_pos[None, :], pos[:, None])
        qb = jax.lax.dynamic_slice_in_dim(qg, b * block, block)
        s = scores(jnp.einsum("tkgd,tckd->tkgc", qb, k), mask[:, None, None, :])
        m_new = jnp.maximum(m, s.max(axis=-1))
        p = jnp.where(mask[:, None, None, :], jnp.exp(s - m_new[..., None]), 0.0)
        alpha = jnp.exp(m - m_new)
        return m_new, l * alpha + p.sum(axis=-1), acc * alpha[..., None] + jnp.einsum("tkgc,tckd->tkgd", p, v)

    def token_block_step(b, carry):
        part = tuple(jax.lax.dynamic_slice_in_dim(x, b * block, block) for x in carry)
        num_chunks = (jax.lax.dynamic_slice_in_dim(cached_len, b * block, block).max() + chunk - 1) // chunk
        part = jax.lax.fori_loop(0, num_chunks, functools.partial(chunk_step, b), part)
        return tuple(jax.lax.dynamic_update_slice_in_dim(x, y, b * block, 0) for x, y in zip(carry, part))

    num_token_blocks = (cu_q_lens[num_seqs[0]] + block - 1) // block
    _, l, acc = jax.lax.fori_loop(0, num_token_blocks, token_block_step, (m, l, acc))
    out = acc / jnp.where(l == 0.0, 1.0, l)[..., None]
    return out.reshape(num_tokens, num_q_heads, head_dim).astype(q.dtype)
