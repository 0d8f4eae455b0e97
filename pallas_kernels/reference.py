"""Ragged paged attention in plain jax.numpy: ground truth for the Pallas kernels and
the CPU backend of the model.

One call serves decode-only, prefill-only and mixed steps. Queries are a flat token axis;
sequence s owns tokens cu_q_lens[s]:cu_q_lens[s+1], which are the *last* tokens of its
kv_lens[s] tokens of context (their K/V are already written to the pages). Tokens past
cu_q_lens[num_seqs] are padding and produce zeros.

The cache is the engine's layer-stacked array, read at `layer`: gathering pages straight
from it avoids materializing a copy of the layer's slice (on CPU that copy costs more than
the attention itself).

The KV context is visited a chunk of pages at a time with an online softmax, for as many
chunks as the longest sequence of this step needs (a dynamic trip count), so memory stays
at O(tokens x chunk) whatever max_model_len is and short steps pay for short contexts.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

_MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)


@functools.partial(jax.jit, static_argnames=("sm_scale", "sliding_window", "soft_cap",
                                             "pages_per_chunk"))
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
) -> jax.Array:
    num_tokens, num_q_heads, head_dim = q.shape
    page_size, num_kv_heads = kv_cache.shape[3], kv_cache.shape[4]
    group = num_q_heads // num_kv_heads
    pages_per_seq = page_indices.shape[1]
    chunk = pages_per_chunk * page_size
    num_chunks_max = -(-pages_per_seq // pages_per_chunk)
    page_indices = jnp.pad(page_indices, ((0, 0), (0, num_chunks_max * pages_per_chunk - pages_per_seq)))

    # Which sequence each token belongs to, and its position in that sequence.
    token = jnp.arange(num_tokens, dtype=jnp.int32)
    seq = jnp.searchsorted(cu_q_lens[1:], token, side="right").astype(jnp.int32)
    valid = token < cu_q_lens[num_seqs[0]]
    seq = jnp.where(valid, seq, 0)
    q_pos = kv_lens[seq] - (cu_q_lens[seq + 1] - token)
    kv_len = jnp.where(valid, kv_lens[seq], 0)

    qg = q.astype(jnp.float32).reshape(num_tokens, num_kv_heads, group, head_dim) * sm_scale
    seq_pages = page_indices[seq]  # [num_tokens, padded pages]

    def body(c, carry):
        m, l, acc = carry
        pages = jax.lax.dynamic_slice_in_dim(seq_pages, c * pages_per_chunk, pages_per_chunk, axis=1)
        kv = kv_cache[layer, :, pages].astype(jnp.float32)  # [tokens, pages, 2, page_size, ...]
        k = kv[:, :, 0].reshape(num_tokens, chunk, num_kv_heads, head_dim)
        v = kv[:, :, 1].reshape(num_tokens, chunk, num_kv_heads, head_dim)
        s = jnp.einsum("tkgd,tckd->tkgc", qg, k)
        if soft_cap is not None:
            s = soft_cap * jnp.tanh(s / soft_cap)
        kv_pos = c * chunk + jnp.arange(chunk, dtype=jnp.int32)
        mask = (kv_pos[None, :] <= q_pos[:, None]) & (kv_pos[None, :] < kv_len[:, None])
        if sliding_window is not None:
            mask &= kv_pos[None, :] > q_pos[:, None] - sliding_window
        s = jnp.where(mask[:, None, None, :], s, _MASK_VALUE)
        m_new = jnp.maximum(m, s.max(axis=-1))
        p = jnp.exp(s - m_new[..., None])
        p = jnp.where(mask[:, None, None, :], p, 0.0)
        alpha = jnp.exp(m - m_new)
        l = l * alpha + p.sum(axis=-1)
        acc = acc * alpha[..., None] + jnp.einsum("tkgc,tckd->tkgd", p, v)
        return m_new, l, acc

    num_chunks = (jnp.max(kv_len) + chunk - 1) // chunk
    init = (jnp.full((num_tokens, num_kv_heads, group), _MASK_VALUE, jnp.float32),
            jnp.zeros((num_tokens, num_kv_heads, group), jnp.float32),
            jnp.zeros((num_tokens, num_kv_heads, group, head_dim), jnp.float32))
    _, l, acc = jax.lax.fori_loop(0, num_chunks, body, init)
    out = acc / jnp.where(l == 0.0, 1.0, l)[..., None]
    return out.reshape(num_tokens, num_q_heads, head_dim).astype(q.dtype)
