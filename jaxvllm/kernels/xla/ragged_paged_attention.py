"""Ragged paged attention in plain jax.numpy: the `xla` attention backend, which any device
compiles; the CPU's where the native kernel cannot run. (The tests' oracle is a separate,
naive loop: tests/kernels/naive_attention.py.)

The cache may be stored in any dtype (a quantized one too: int8, fp8, or fp8 as uint8 bits
with `kv_dtype`); pages are converted to float32 as loaded, and scales are the caller's.

One call serves decode-only, prefill-only and mixed steps. Queries are a flat token axis;
sequence s owns tokens cu_q_lens[s]:cu_q_lens[s+1], which are the *last* tokens of its
kv_lens[s] tokens of context (their K/V are already written to the pages). Tokens past
cu_q_lens[num_seqs] are padding and produce zeros.

Attention is computed in parts merged by their softmax statistics (an online softmax),
shaped for XLA on CPU, which runs large matmuls well and small batched ones, gathers of
many small slices and transposes inside a dot badly, and whose copies run at memory speed,
so that a gathered page costs about what reading it twice does:
1. the step's own tokens attend to each other, a block of queries by a block of keys, and
   only over the key blocks from the first token of the query block's first sequence up to
   its last row (a fresh prefill's work; several short prompts in one step skip each
   other's blocks, one long prompt skips the blocks above the causal diagonal);
2. a sequence with several query tokens (a prefill chunk after cached context) attends to
   its cached context a block of queries by a chunk of pages at a time, so each page is
   read once per query block, not once per token;
3. a sequence with one query token (decode) attends to its cached context in blocks of
   tokens taken longest context first, a short chunk of pages at a time: a block's tokens
   share one trip count, few pages past a token's end are gathered, and each chunk's
   gathered pages are small enough to stay in the core's cache while they are used.
Parts 2 and 3 start at the first chunk a sliding window reaches.
All trip counts are dynamic, so padding and absent work cost nothing. Pages are gathered
as whole rows of the cache viewed as [layers * 2 * pages, page_size * kv_heads * head_dim],
the one gather XLA on CPU runs at memory speed, and never as a copy of the layer's slice.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

_MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)


def as_elements(x: jax.Array, kv_dtype) -> jax.Array:
    """Cache elements as loaded -> their dtype: a cache stored as bits (uint8) holds kv_dtype
    elements (an fp8 cache where XLA cannot update fp8 in place); else x as it is."""
    return x if kv_dtype is None else jax.lax.bitcast_convert_type(x, kv_dtype)


@functools.partial(jax.jit, static_argnames=("sm_scale", "soft_cap", "kv_dtype", "kv_layout",
                                             "pages_per_chunk", "decode_pages_per_chunk",
                                             "token_block", "query_block"))
def ragged_paged_attention(
    q: jax.Array,             # [num_tokens, num_q_heads, head_dim]
    kv_cache: jax.Array,      # [num_layers, 2 (K, V), num_pages, page_size, num_kv_heads, head_dim]
                              # or, kv_layout "tpu", [..., page_size / 8, 8, num_kv_heads * lanes]
                              # (backends/tpu.py: a head's lanes are head_dim rounded up to 128)
    layer: jax.Array,         # i32[]: which layer of kv_cache to read
    kv_lens: jax.Array,       # i32[max_num_seqs]
    page_indices: jax.Array,  # i32[max_num_seqs, pages_per_seq]
    cu_q_lens: jax.Array,     # i32[max_num_seqs + 1]
    num_seqs: jax.Array,      # i32[1]
    *,
    sm_scale: float,
    sliding_window: int | jax.Array | None = None,  # may be traced (a per-layer value); <= 0: none
    soft_cap: float | None = None,
    kv_dtype=None,
    kv_layout: str = "portable",
    pages_per_chunk: int = 8,
    decode_pages_per_chunk: int = 2,
    token_block: int = 16,
    query_block: int = 128,
) -> jax.Array:
    num_tokens, num_q_heads, head_dim = q.shape
    tpu_layout = kv_layout == "tpu"
    num_pages = kv_cache.shape[2]
    page_size = kv_cache.shape[3] * kv_cache.shape[4] if tpu_layout else kv_cache.shape[3]
    lanes = -(-head_dim // 128) * 128 if tpu_layout else head_dim
    num_kv_heads = kv_cache.shape[-1] // lanes if tpu_layout else kv_cache.shape[4]
    group = num_q_heads // num_kv_heads
    pages_per_seq = page_indices.shape[1]
    chunk = pages_per_chunk * page_size
    num_chunks_max = -(-pages_per_seq // pages_per_chunk)
    page_indices = jnp.pad(page_indices, ((0, 0), (0, num_chunks_max * pages_per_chunk - pages_per_seq)))
    # A page per row, as a view that merges only leading axes of the layout stored (a TPU
    # tiles the last two: flattening [page_size, kv_heads * head_dim] would copy the pool).
    page_rows = kv_cache.reshape((-1,) + kv_cache.shape[3:] if tpu_layout
                                 else (-1, page_size * num_kv_heads * head_dim))

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
        if sliding_window is None:
            return True
        return (sliding_window <= 0) | (kv_pos > q_pos - sliding_window)

    def first_chunk(q_first_pos, size):
        """The first chunk of `size` context tokens the window of a query at q_first_pos
        reaches: the pages before it are never read (a sliding group's are not even held)."""
        if sliding_window is None:
            return 0
        return jnp.where(sliding_window > 0, jnp.maximum(q_first_pos - sliding_window + 1, 0) // size, 0)

    def gather(pages, which):
        """K or V of `pages` (any shape [..., n]) -> [..., n * page_size, kv_heads, head_dim]."""
        rows = page_rows.at[(layer * 2 + which) * num_pages + pages].get(mode="promise_in_bounds")
        rows = rows.reshape(pages.shape[:-1] + (-1, num_kv_heads, lanes))[..., :head_dim]
        return as_elements(rows, kv_dtype).astype(jnp.float32)

    def online_softmax(carry, s, mask, v):
        """Fold scores s [..., n] (masked by mask) and values v [..., n, head_dim] into carry."""
        m, l, acc = carry
        s = mask_scores(s, mask)
        m_new = jnp.maximum(m, s.max(axis=-1))
        p = jnp.where(mask, jnp.exp(s - m_new[..., None]), 0.0)
        alpha = jnp.exp(m - m_new)
        return m_new, l * alpha + p.sum(axis=-1), acc * alpha[..., None] + p @ v

    # Part 1: the step's own tokens, read back from their slots (row ids fit int32 for
    # caches of under 2**31 token slots). Carries start at the mask value, not -inf, so that
    # rows no part visits (padding) merge without NaNs.
    slot = page_indices[seq, q_pos // page_size] * page_size + q_pos % page_size
    slot_rows = kv_cache.reshape(-1, num_kv_heads * lanes)
    k_new, v_new = (jnp.pad(as_elements(slot_rows.at[(layer * 2 + which) * num_pages * page_size + slot]
                                        .get(mode="promise_in_bounds"), kv_dtype)
                            .reshape(num_tokens, num_kv_heads, lanes)[..., :head_dim].astype(jnp.float32),
                            ((0, qb_rows), (0, 0), (0, 0))) for which in (0, 1))
    k_new, v_new = k_new.transpose(1, 2, 0), v_new.transpose(1, 0, 2)  # [h, d, tokens], [h, tokens, d]
    seq_p = jnp.pad(jnp.where(valid, seq, -1), (0, qb_rows), constant_values=-1)  # padding matches no row
    pos_p = jnp.pad(q_pos, (0, qb_rows))
    seq_start = cu_q_lens[seq]
    num_valid = cu_q_lens[num_seqs[0]]
    carry = (jnp.full((num_kv_heads, num_tokens * group + pad), _MASK_VALUE, jnp.float32),
             jnp.zeros((num_kv_heads, num_tokens * group + pad), jnp.float32),
             jnp.zeros((num_kv_heads, num_tokens * group + pad, head_dim), jnp.float32))

    def own_block(b, carry):
        r0 = b * qb_rows
        rows = r0 + jnp.arange(qb_rows, dtype=jnp.int32)
        row_seq = jax.lax.dynamic_slice_in_dim(seq_p, r0, qb_rows)
        row_pos = jax.lax.dynamic_slice_in_dim(pos_p, r0, qb_rows)
        qb = jax.lax.dynamic_slice_in_dim(qg, r0 * group, qb_rows * group, axis=1)

        def key_block(c, part):
            k0 = c * qb_rows
            key_seq = jax.lax.dynamic_slice_in_dim(seq_p, k0, qb_rows)
            key_pos = jax.lax.dynamic_slice_in_dim(pos_p, k0, qb_rows)
            mask = ((row_seq[:, None] == key_seq[None, :]) & (rows < num_valid)[:, None]
                    & (key_pos[None, :] <= row_pos[:, None]) & in_window(key_pos[None, :], row_pos[:, None]))
            mask = jnp.repeat(mask, group, axis=0)[None]
            k = jax.lax.dynamic_slice_in_dim(k_new, k0, qb_rows, axis=2)
            return online_softmax(part, qb @ k, mask, jax.lax.dynamic_slice_in_dim(v_new, k0, qb_rows, axis=1))

        part = tuple(jax.lax.dynamic_slice_in_dim(x, r0 * group, qb_rows * group, axis=1) for x in carry)
        last = jnp.minimum(r0 + qb_rows, num_valid)
        part = jax.lax.fori_loop(seq_start[r0] // qb_rows, (last + qb_rows - 1) // qb_rows, key_block, part)
        return tuple(jax.lax.dynamic_update_slice_in_dim(x, y, r0 * group, axis=1) for x, y in zip(carry, part))

    carry = jax.lax.fori_loop(0, (num_valid + qb_rows - 1) // qb_rows, own_block, carry)

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
            part = jax.lax.fori_loop(first_chunk(kv_lens[s] - (end - r0), chunk), (cached + chunk - 1) // chunk,
                                     kv_chunk, part)
            return tuple(jax.lax.dynamic_update_slice_in_dim(x, y, r0 * group, axis=1)
                         for x, y in zip(carry, part))
        return jax.lax.fori_loop(0, num_q_blocks, q_block, carry)

    carry = jax.lax.fori_loop(0, needs_part2.sum(), prefill_seq, carry)

    # Part 3: decode tokens (one query token in their sequence) against their cached
    # context, longest context first, a block of tokens by a chunk of pages at a time. Their
    # statistics are merged into the carry once, at the end.
    dchunk = decode_pages_per_chunk * page_size
    is_decode = valid & (q_lens[seq] == 1) & (cached_len > 0)
    decode_cached = jnp.where(is_decode, cached_len, 0)
    order = jnp.argsort(-decode_cached, stable=True).astype(jnp.int32)
    sorted_cached = jnp.pad(decode_cached[order], (0, block))
    order = jnp.pad(order, (0, block))  # blocks past the end read token 0 and are masked
    q_tok = qg[:, :num_tokens * group].reshape(num_kv_heads, num_tokens, group, head_dim).swapaxes(0, 1)

    def decode_chunk(tokens, cached, qb, c, part):  # part: [block, kv_heads, group(, head_dim)]
        pages = jax.lax.dynamic_slice_in_dim(page_indices[seq[tokens]], c * decode_pages_per_chunk,
                                             decode_pages_per_chunk, axis=1)
        kv_pos = c * dchunk + jnp.arange(dchunk, dtype=jnp.int32)
        mask = (kv_pos[None, :] < cached[:, None]) & in_window(kv_pos[None, :], q_pos[tokens][:, None])
        k = gather(pages, 0).transpose(0, 2, 3, 1)  # [block, kv_heads, head_dim, chunk]
        v = gather(pages, 1).transpose(0, 2, 1, 3)  # [block, kv_heads, chunk, head_dim]
        return online_softmax(part, qb @ k, mask[:, None, None, :], v)

    def token_block_step(b, dec):
        tokens = jax.lax.dynamic_slice_in_dim(order, b * block, block)
        cached = jax.lax.dynamic_slice_in_dim(sorted_cached, b * block, block)
        part = tuple(jnp.full((block, num_kv_heads, group) + x.shape[3:], v, jnp.float32)
                     for x, v in zip(dec, (_MASK_VALUE, 0.0, 0.0)))
        step = functools.partial(decode_chunk, tokens, cached, q_tok[tokens])
        # A decode token's position is its cached length; the block's earliest one bounds it.
        live = cached > 0
        earliest = jnp.where(live.any(), jnp.min(jnp.where(live, cached, jnp.iinfo(jnp.int32).max)), 0)
        part = jax.lax.fori_loop(first_chunk(earliest, dchunk), (cached[0] + dchunk - 1) // dchunk, step, part)
        return tuple(jax.lax.dynamic_update_slice_in_dim(x, y, b * block, axis=0) for x, y in zip(dec, part))

    dec = tuple(jnp.full((num_tokens + block, num_kv_heads, group) + shape, v, jnp.float32)
                for shape, v in (((), _MASK_VALUE), ((), 0.0), ((head_dim,), 0.0)))
    dec = jax.lax.fori_loop(0, (is_decode.sum() + block - 1) // block, token_block_step, dec)

    # Merge, back in token order and in rows (KV head, token * group + q head in group).
    inverse = jnp.zeros(num_tokens, jnp.int32).at[order[:num_tokens]].set(jnp.arange(num_tokens, dtype=jnp.int32))
    dm, dl, dacc = (x[inverse].swapaxes(0, 1).reshape((num_kv_heads, num_tokens * group) + x.shape[3:])
                    for x in dec)
    m, l, acc = (x[:, :num_tokens * group] for x in carry)
    m_new = jnp.maximum(m, dm)
    a, da = jnp.exp(m - m_new), jnp.exp(dm - m_new)
    l, acc = l * a + dl * da, acc * a[..., None] + dacc * da[..., None]
    out = (acc / jnp.where(l == 0.0, 1.0, l)[..., None]).reshape(num_kv_heads, num_tokens, group, head_dim)
    return out.swapaxes(0, 1).reshape(num_tokens, num_q_heads, head_dim).astype(q.dtype)
