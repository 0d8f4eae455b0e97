"""Ragged paged attention in plain jax.numpy: ground truth for the Pallas kernels and
the CPU backend of the model.

One call serves decode-only, prefill-only and mixed steps. Queries are a flat token axis;
sequence s owns tokens cu_q_lens[s]:cu_q_lens[s+1], which are the *last* tokens of its
kv_lens[s] tokens of context (their K/V are already written to the pages). Tokens past
cu_q_lens[num_seqs] are padding and produce zeros.

Attention is computed in parts merged by their softmax statistics (an online softmax),
shaped for XLA on CPU, which runs large matmuls well and small batched ones, gathers of
many small slices and transposes inside a dot badly:
1. the step's own tokens attend to each other with one dense, masked [tokens x tokens]
   matmul per KV head (all of a fresh prefill's work);
2. a sequence with several query tokens (a prefill chunk after cached context) attends to
   its cached context a block of queries by a chunk of pages at a time, so each page is
   read once per query block, not once per token;
3. a sequence with one query token (decode) attends to its cached context in blocks of
   tokens, a chunk of pages at a time.
All trip counts are dynamic, so padding and absent work cost nothing. Pages are gathered
as whole rows of the cache viewed as [layers * 2 * pages, page_size * kv_heads * head_dim],
the one gather XLA on CPU runs at memory speed, and never as a copy of the layer's slice.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

_MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)


@functools.partial(jax.jit, static_argnames=("sm_scale", "sliding_window", "soft_cap",
                                             "pages_per_chunk", "token_block", "query_block"))
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
    query_block: int = 128,
) -> jax.Array:
    num_tokens, num_q_heads, head_dim = q.shape
    _, _, num_pages, page_size, num_kv_heads, _ = kv_cache.shape
    group = num_q_heads // num_kv_heads
    pages_per_seq = page_indices.shape[1]
    chunk = pages_per_chunk * page_size
    num_chunks_max = -(-pages_per_seq // pages_per_chunk)
    page_indices = jnp.pad(page_indices, ((0, 0), (0, num_chunks_max * pages_per_chunk - pages_per_seq)))
    page_rows = kv_cache.reshape(-1, page_size * num_kv_heads * head_dim)

    # Which sequence each token belongs to, its position, and the context cached before it.
    token = jnp.arange(num_tokens, dtype=jnp.int32)
    seq = jnp.searchsorted(cu_q_lens[1:], token, side="right").astype(jnp.int32)
    valid = token < cu_q_lens[num_seqs[0]]
    seq = jnp.where(valid, seq, 0)
    q_lens = cu_q_lens[1:] - cu_q_lens[:-1]
    q_pos = jnp.where(valid, kv_lens[seq] - (cu_q_lens[seq + 1] - token), 0)
    cached_len = jnp.where(valid, kv_lens[seq] - q_lens[seq], 0)

    # Query rows are (KV head, token * group + q head in group): one matmul per KV head
    # serves the whole group. Carries get `pad` rows so that no block slides back over rows
    # it does not own where it runs past the end.
    qb_rows, block = min(query_block, num_tokens), min(token_block, num_tokens)
    pad = max(qb_rows, block) * group
    qg = q.astype(jnp.float32).reshape(num_tokens, num_kv_heads, group, head_dim) * sm_scale
    qg = jnp.pad(qg.transpose(1, 0, 2, 3).reshape(num_kv_heads, -1, head_dim), ((0, 0), (0, pad), (0, 0)))

    def mask_scores(s, mask):
        if soft_cap is not None:
            s = soft_cap * jnp.tanh(s / soft_cap)
        return jnp.where(mask, s, _MASK_VALUE)

    def in_window(kv_pos, q_pos):
        return True if sliding_window is None else kv_pos > q_pos - sliding_window

    def gather(pages, which):
        """K or V of `pages` (any shape [..., n]) -> [..., n * page_size, kv_heads, head_dim]."""
        rows = page_rows.at[(layer * 2 + which) * num_pages + pages].get(mode="promise_in_bounds")
        return rows.reshape(pages.shape[:-1] + (-1, num_kv_heads, head_dim)).astype(jnp.float32)

    def online_softmax(carry, s, mask, v):
        """Fold scores s [..., n] (masked by mask) and values v [..., n, head_dim] into carry."""
        m, l, acc = carry
        s = mask_scores(s, mask)
        m_new = jnp.maximum(m, s.max(axis=-1))
        p = jnp.where(mask, jnp.exp(s - m_new[..., None]), 0.0)
        alpha = jnp.exp(m - m_new)
        return m_new, l * alpha + p.sum(axis=-1), acc * alpha[..., None] + p @ v

    # Part 1: the step's own tokens, read back from their slots (row ids fit int32 for
    # caches of under 2**31 token slots).
    slot = page_indices[seq, q_pos // page_size] * page_size + q_pos % page_size
    slot_rows = kv_cache.reshape(-1, num_kv_heads * head_dim)
    k_new, v_new = (slot_rows.at[(layer * 2 + which) * num_pages * page_size + slot]
                    .get(mode="promise_in_bounds").reshape(num_tokens, num_kv_heads, head_dim)
                    .astype(jnp.float32) for which in (0, 1))
    mask = (valid[:, None] & valid[None, :] & (seq[:, None] == seq[None, :])
            & (q_pos[None, :] <= q_pos[:, None]) & in_window(q_pos[None, :], q_pos[:, None]))
    mask = jnp.pad(jnp.repeat(mask, group, axis=0), ((0, pad), (0, 0)))[None]
    s = mask_scores(qg @ k_new.transpose(1, 2, 0), mask)
    m = s.max(axis=-1)
    p = jnp.where(mask, jnp.exp(s - m[..., None]), 0.0)
    carry = (m, p.sum(axis=-1), p @ v_new.transpose(1, 0, 2))

    # Part 2: sequences with several query tokens and cached context, a block of queries by
    # a chunk of pages at a time. Only those sequences are visited: a loop trip costs
    # microseconds even when it does nothing, per sequence and layer.
    seq_ids = jnp.arange(q_lens.shape[0], dtype=jnp.int32)
    needs_part2 = (seq_ids < num_seqs[0]) & (q_lens > 1) & (kv_lens > q_lens)
    part2_seqs = jnp.argsort(~needs_part2, stable=True).astype(jnp.int32)

    def prefill_seq(i, carry):
        s = part2_seqs[i]
        start, end = cu_q_lens[s], cu_q_lens[s + 1]
        cached = kv_lens[s] - (end - start)
        num_q_blocks = (end - start + qb_rows - 1) // qb_rows

        def q_block(b, carry):
            r0 = start + b * qb_rows
            rows = r0 + jnp.arange(qb_rows, dtype=jnp.int32)
            pos = kv_lens[s] - (end - rows)
            qb = jax.lax.dynamic_slice_in_dim(qg, r0 * group, qb_rows * group, axis=1)

            def kv_chunk(c, part):
                pages = jax.lax.dynamic_slice_in_dim(page_indices[s], c * pages_per_chunk, pages_per_chunk)
                kv_pos = c * chunk + jnp.arange(chunk, dtype=jnp.int32)
                mask = ((rows < end)[:, None] & (kv_pos < cached)[None, :]
                        & in_window(kv_pos[None, :], pos[:, None]))
                mask = jnp.repeat(mask, group, axis=0)[None]
                k = gather(pages, 0).transpose(1, 2, 0)  # [kv_heads, head_dim, chunk]
                return online_softmax(part, qb @ k, mask, gather(pages, 1).transpose(1, 0, 2))

            part = tuple(jax.lax.dynamic_slice_in_dim(x, r0 * group, qb_rows * group, axis=1) for x in carry)
            part = jax.lax.fori_loop(0, (cached + chunk - 1) // chunk, kv_chunk, part)
            return tuple(jax.lax.dynamic_update_slice_in_dim(x, y, r0 * group, axis=1)
                         for x, y in zip(carry, part))
        return jax.lax.fori_loop(0, num_q_blocks, q_block, carry)

    carry = jax.lax.fori_loop(0, needs_part2.sum(), prefill_seq, carry)

    # Part 3: decode tokens (one query token in their sequence), a block of tokens by a
    # chunk of pages at a time; blocks without such tokens cost nothing.
    decode_cached = jnp.pad(jnp.where(q_lens[seq] == 1, cached_len, 0), (0, block))
    seq_pages = jnp.pad(page_indices[seq], ((0, block), (0, 0)))
    q_pos = jnp.pad(q_pos, (0, block))

    def decode_chunk(b, c, part):  # part: per token, [block, kv_heads, group(, head_dim)]
        pages = jax.lax.dynamic_slice_in_dim(seq_pages, b * block, block)
        pages = jax.lax.dynamic_slice_in_dim(pages, c * pages_per_chunk, pages_per_chunk, axis=1)
        kv_pos = c * chunk + jnp.arange(chunk, dtype=jnp.int32)
        cached = jax.lax.dynamic_slice_in_dim(decode_cached, b * block, block)
        pos = jax.lax.dynamic_slice_in_dim(q_pos, b * block, block)
        mask = (kv_pos[None, :] < cached[:, None]) & in_window(kv_pos[None, :], pos[:, None])
        qb = jax.lax.dynamic_slice_in_dim(qg, b * block * group, block * group, axis=1)
        qb = qb.reshape(num_kv_heads, block, group, head_dim).swapaxes(0, 1)
        k = gather(pages, 0).transpose(0, 2, 3, 1)  # [block, kv_heads, head_dim, chunk]
        v = gather(pages, 1).transpose(0, 2, 1, 3)  # [block, kv_heads, chunk, head_dim]
        return online_softmax(part, qb @ k, mask[:, None, None, :], v)

    def token_block_step(b, carry):
        part = tuple(jax.lax.dynamic_slice_in_dim(x, b * block * group, block * group, axis=1)
                     .reshape((num_kv_heads, block, group) + x.shape[2:]).swapaxes(0, 1) for x in carry)
        num_chunks = (jax.lax.dynamic_slice_in_dim(decode_cached, b * block, block).max() + chunk - 1) // chunk
        part = jax.lax.fori_loop(0, num_chunks, functools.partial(decode_chunk, b), part)
        return tuple(jax.lax.dynamic_update_slice_in_dim(
            x, y.swapaxes(0, 1).reshape((num_kv_heads, -1) + x.shape[2:]), b * block * group, axis=1)
            for x, y in zip(carry, part))

    num_token_blocks = (cu_q_lens[num_seqs[0]] + block - 1) // block
    _, l, acc = jax.lax.fori_loop(0, num_token_blocks, token_block_step, carry)
    l, acc = l[:, :num_tokens * group], acc[:, :num_tokens * group]
    out = (acc / jnp.where(l == 0.0, 1.0, l)[..., None]).reshape(num_kv_heads, num_tokens, group, head_dim)
    return out.swapaxes(0, 1).reshape(num_tokens, num_q_heads, head_dim).astype(q.dtype)
