"""Ragged paged attention for GPUs: a Pallas kernel on the Triton backend.

Same contract as jaxvllm/kernels/xla/ragged_paged_attention.py. The grid is (work item, KV head): a work
item is one (block of `block_q` query tokens, sequence) pair (common.work_list), so decode,
prefill and mixed steps run in one launch. A program loads its query rows for one KV head
— the `group` query heads sharing it, padded to a power of two as Triton requires — and
walks the sequence's pages `pages_per_block` at a time (a gather of whole pages) with an
online softmax, reading K and V straight from the layer-stacked cache (no copy of the layer).
Only pages the block's queries can see are read: causal and sliding-window limits bound the
page range. Rows are stored under a mask, so items for neighbouring sequences in one block
never clobber each other; padding tokens are zeroed outside the kernel. When the grid is
small (few sequences), a third grid axis splits each item's pages over `num_splits`
programs whose partial (m, l, acc) are merged afterwards (flash-decoding).

Query rows are laid out [kv_head, token * group_pow2 + g, head_dim] so that a block is one
contiguous 2-D tile and every matmul is [rows, head_dim] x [head_dim, kv_block]. Triton wants
power-of-two tiles: head_dim and page_size must be powers of two.

Checked on an H200 (jax 0.11.2, scripts/device_check.sh): float32 within 1e-5 and bfloat16
within 2e-2 of the naive oracle (tests/kernels/naive_attention.py); bfloat16 decode of 256 x
2k-token sequences at ~77% of the measured copy bandwidth, 64 x 2k at ~52-58% (the block
sizes below come from that run).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels.common import (
    as_elements,
    attention_mask,
    kv_range,
    layer_and_window,
    precision_for,
    qk,
    softmax_update,
    work_list,
)

_MIN_PROGRAMS = 512  # split KV below this many programs (~4 per SM on a 132-SM H100/H200)


def _next_pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def _kernel(layer_ref, kv_lens_ref, pages_ref, cu_ref, block_ref, seq_ref,  # scalars
            q_ref, kv_ref,  # [kv_heads, rows_total, head_dim], full cache
            *out_refs,      # o [kv_heads, rows_total, head_dim], or with num_splits > 1 the
                            # partials acc [splits, kv_heads, rows_total, head_dim], m, l [..., 1]
            block_q, group, page_size, pages_per_block, pages_per_seq, num_splits, sm_scale,
            windowed, soft_cap, kv_dtype, precision):
    j, h, split = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    seq = seq_ref[j]

    @pl.when(seq >= 0)
    def _():
        blk = block_ref[j]
        layer = layer_ref[0]
        sliding_window = layer_ref[1] if windowed else None  # traced: <= 0 for none
        q_start, q_end, kv_len = cu_ref[seq], cu_ref[seq + 1], kv_lens_ref[seq]
        rows = block_q * group
        token = blk * block_q + jax.lax.broadcasted_iota(jnp.int32, (rows,), 0) // group
        row_valid = (token >= q_start) & (token < q_end)
        q_pos = kv_len - (q_end - token)
        first_t = jnp.maximum(q_start, blk * block_q)
        last_t = jnp.minimum(q_end, (blk + 1) * block_q) - 1
        lo, hi = kv_range(kv_len - (q_end - first_t), kv_len - (q_end - last_t), sliding_window)

        q = q_ref[h, pl.ds(blk * rows, rows), :]

        def body(i, carry):
            m, l, acc = carry
            pages = pages_ref[pl.ds(seq * pages_per_seq + i * pages_per_block, pages_per_block)]
            # A quantized cache (int8, fp8) is converted as loaded; its scales are the caller's.
            k, v = (as_elements(kv_ref[layer, which, pages, :, h, :], kv_dtype)
                    .reshape(block_kv, head_dim).astype(q.dtype) for which in (0, 1))
            kv_pos = i * block_kv + jax.lax.broadcasted_iota(jnp.int32, (block_kv,), 0)
            mask = attention_mask(q_pos[:, None], kv_pos[None, :], row_valid[:, None], sliding_window)
            return softmax_update(qk(q, k, precision) * sm_scale, mask, m, l, acc, v,
                                  soft_cap=soft_cap, precision=precision)

        head_dim = q.shape[-1]
        block_kv = pages_per_block * page_size
        init = (jnp.full((rows, 1), -1e30, jnp.float32),
                jnp.zeros((rows, 1), jnp.float32), jnp.zeros((rows, head_dim), jnp.float32))
        c_lo, c_hi = lo // block_kv, (hi + block_kv - 1) // block_kv
        if num_splits == 1:
            _, l, acc = jax.lax.fori_loop(c_lo, c_hi, body, init)
            out = acc / jnp.where(l == 0.0, 1.0, l)
            (o_ref,) = out_refs
            plgpu.store(o_ref.at[h, pl.ds(blk * rows, rows), :], out.astype(o_ref.dtype),
                        mask=row_valid[:, None])
        else:  # this program's share of the KV blocks; merged outside by their statistics
            per = (c_hi - c_lo + num_splits - 1) // num_splits
            start = c_lo + split * per
            m, l, acc = jax.lax.fori_loop(start, jnp.minimum(c_hi, start + per), body, init)
            rows_at = (split, h, pl.ds(blk * rows, rows), slice(None))
            for ref, x in zip(out_refs, (acc, m, l)):
                plgpu.store(ref.at[rows_at], x, mask=row_valid[:, None])


@functools.partial(jax.jit, static_argnames=("sm_scale", "soft_cap", "kv_dtype", "block_q",
                                             "pages_per_block", "num_splits", "interpret", "num_warps", "num_stages"))
def ragged_paged_attention(
    q: jax.Array,             # [num_tokens, num_q_heads, head_dim]
    kv_cache: jax.Array,      # [num_layers, 2 (K, V), num_pages, page_size, num_kv_heads, head_dim]
    layer: jax.Array,         # i32[]
    kv_lens: jax.Array,       # i32[max_num_seqs]
    page_indices: jax.Array,  # i32[max_num_seqs, pages_per_seq]
    cu_q_lens: jax.Array,     # i32[max_num_seqs + 1]
    num_seqs: jax.Array,      # i32[1]
    *,
    sm_scale: float,
    sliding_window: int | jax.Array | None = None,  # may be traced; <= 0: none
    soft_cap: float | None = None,
    kv_dtype=None,
    block_q: int | None = None,
    pages_per_block: int | None = None,
    num_splits: int | None = None,
    interpret: bool = False,
    num_warps: int = 4,
    num_stages: int = 3,
) -> jax.Array:
    num_tokens, num_q_heads, head_dim = q.shape
    page_size, num_kv_heads = kv_cache.shape[3], kv_cache.shape[4]
    group = num_q_heads // num_kv_heads
    g2 = _next_pow2(group)
    # Rows per program: 64 (and at least 16 for Triton's dot); block_q a power of two.
    block_q = block_q or max(1, 64 // g2)
    # KV tokens per inner step: 16 KiB of K (and as much V) per pipeline stage, 16..128
    # tokens (a power of two, so page_size must be one too). Measured on an H200 (bf16,
    # head_dim 128, decode): 64 tokens beat 32 and 128; larger blocks overflow shared memory
    # in float32 and leave one program per SM.
    block_kv = min(128, max(16, 16384 // (head_dim * kv_cache.dtype.itemsize)))
    pages_per_block = pages_per_block or max(1, block_kv // page_size)
    num_blocks = -(-num_tokens // block_q)
    padded = num_blocks * block_q

    qg = q.reshape(num_tokens, num_kv_heads, group, head_dim)
    qg = jnp.pad(qg, ((0, padded - num_tokens), (0, 0), (0, g2 - group), (0, 0)))
    qg = qg.transpose(1, 0, 2, 3).reshape(num_kv_heads, padded * g2, head_dim)

    # Flat page table, clipped to real pages and padded so a block past a row's end reads
    # (masked) real pages, never out of bounds.
    pages = jnp.pad(jnp.clip(page_indices, 0, kv_cache.shape[2] - 1).reshape(-1), (0, pages_per_block))
    block, seq, _ = work_list(cu_q_lens, num_seqs, num_tokens, block_q)
    # Split each item's KV range over several programs when the grid alone is too small
    # to keep every SM streaming (decode of a few long sequences). On an H200 splitting did
    # not help decode of 64+ sequences, so it is kept for small grids.
    num_items = block.shape[0] * num_kv_heads
    num_splits = num_splits or min(8, max(1, _MIN_PROGRAMS // num_items))
    kernel = functools.partial(
        _kernel, block_q=block_q, group=g2, page_size=page_size, pages_per_block=pages_per_block,
        num_splits=num_splits,
        pages_per_seq=page_indices.shape[1], sm_scale=sm_scale, windowed=sliding_window is not None,
        soft_cap=soft_cap, kv_dtype=kv_dtype, precision=precision_for(q.dtype))
    if num_splits == 1:
        out_shape = jax.ShapeDtypeStruct(qg.shape, q.dtype)
    else:
        part = (num_splits,) + qg.shape[:2]
        out_shape = (jax.ShapeDtypeStruct(part + (head_dim,), jnp.float32),
                     jax.ShapeDtypeStruct(part + (1,), jnp.float32),
                     jax.ShapeDtypeStruct(part + (1,), jnp.float32))
    out = pl.pallas_call(
        kernel,
        grid=(block.shape[0], num_kv_heads, num_splits),
        out_shape=out_shape,
        interpret=interpret,
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages),
        name="ragged_paged_attention_gpu",
    )(layer_and_window(layer, sliding_window), kv_lens, pages, cu_q_lens,
      block, seq, qg, kv_cache)

    if num_splits > 1:
        acc, m, l = out
        w = jnp.exp(m - m.max(axis=0))
        l = (w * l).sum(axis=0)
        out = (w * acc).sum(axis=0) / jnp.where(l == 0.0, 1.0, l)
    out = out.reshape(num_kv_heads, padded, g2, head_dim)[:, :num_tokens, :group]
    out = out.transpose(1, 0, 2, 3).reshape(num_tokens, num_q_heads, head_dim)
    valid = jnp.arange(num_tokens) < cu_q_lens[num_seqs[0]]
    return jnp.where(valid[:, None, None], out, 0).astype(q.dtype)
