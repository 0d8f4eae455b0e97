"""Ragged paged attention for TPUs: a Pallas Mosaic kernel.

Same contract as jaxvllm/kernels/xla/ragged_paged_attention.py. The grid is one sequential axis
of work items (common.work_list: one (block of `block_q` query tokens, sequence) pair each), so
a decode, prefill or mixed step is one launch. The work list, lengths and layer index are
scalar-prefetched into SMEM; the index maps use them to pick each item's query block, which
stays resident in VMEM while consecutive items of the same block fill in their sequences' rows
(the output block is zeroed at the block's first item and written back to HBM when the block
changes).

The cache stays in HBM (memory space ANY), in the TPU platform's layout (platforms/tpu.py:
[layers, 2, pages, page_size / 8, 8, kv_heads * padded_head_dim]). For each item the kernel
walks only the pages its queries can see (causal and sliding-window limits), `pages_per_block`
pages at a time: each page is one DMA (all heads, K and V) into one of two VMEM buffers, the
next block's DMAs being issued before waiting on the current one (double buffering). The page
table stays in HBM as well: SMEM (1 MiB) cannot hold max_num_seqs x pages_per_seq indices at
long context (256 x 1,024 fill it), so a block's indices come in by DMA, one block ahead of its
pages, into two SMEM slots of one table tile each. Per KV head, K and V of the block are a
contiguous lane slice of the buffer (a load Mosaic makes in any dtype; it refuses strided
sublane loads of 16- and 8-bit data), the `group` query heads sharing that KV head form the
rows of one [rows, head_dim] matmul, and an online softmax keeps m, l and the accumulator in
VMEM scratch.

Compiled by libtpu's Mosaic for compile-only v5e, v6e and v5p chips (`jaxvllm compile`,
tests/platforms/test_tpu_compile.py, benchmarks/tpu_kernel_matrix.py); run in interpret mode
(interpret=True and pltpu.InterpretParams) by the parity tests. No TPU has run it yet.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

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

_LANES = 128
SUBLANES = 8  # a page's tokens in rows of 8 in the TPU layout (platforms/tpu.py)
_IDX_TILE = 128  # int32s in a tile of a 1-D array in HBM: where a DMA of page indices may start


def padded_head_dim(head_dim: int) -> int:
    """Lanes a head takes in a [..., page_size, kv_heads * lanes] cache (platforms/tpu.py):
    whole 128-lane vregs."""
    return -(-head_dim // _LANES) * _LANES


def _kernel(layer_ref, kv_lens_ref, cu_ref, block_ref, seq_ref, first_ref,  # SMEM
            q_ref,      # [kv_heads, rows, head_dim] (VMEM block)
            pages_hbm,  # [max_num_seqs * pages_per_seq] (HBM), rows padded to whole tiles
            kv_hbm,     # [layers, 2, pages, page_size / r, r, kv_heads * padded_head_dim] (HBM; r = 8)
            o_ref,      # [kv_heads, rows, head_dim] (VMEM block)
            idx, idx_sems,  # [2 (slot), pages_per_block] (SMEM), DMA[2]
            buf, sems,  # [2 (slot), 2 (K, V), pages_per_block * page_size / r, r, kv_heads * padded_head_dim], DMA[2]
            m_ref, l_ref, acc_ref,  # [kv_heads, rows, 128], same, [kv_heads, rows, head_dim]
            *, block_q, group, page_size, pages_per_block, pages_per_seq, sm_scale,
            windowed, soft_cap, kv_dtype, precision):
    j = pl.program_id(0)
    seq = seq_ref[j]
    num_kv_heads, rows, head_dim = q_ref.shape
    block_kv = pages_per_block * page_size
    lanes = buf.shape[-1] // num_kv_heads  # per head: padded_head_dim

    @pl.when(first_ref[j] == 1)
    def _():
        o_ref[...] = jnp.zeros_like(o_ref)

    @pl.when(seq >= 0)
    def _():
        blk = block_ref[j]
        layer = layer_ref[0]
        sliding_window = layer_ref[1] if windowed else None  # traced: <= 0 for none
        q_start, q_end, kv_len = cu_ref[seq], cu_ref[seq + 1], kv_lens_ref[seq]
        # row // group through float32 (exact at these sizes): vector integer division by a
        # non-power-of-two is not something to count on in Mosaic.
        row = jax.lax.broadcasted_iota(jnp.int32, (rows, 1), 0).astype(jnp.float32)
        token = blk * block_q + jnp.floor((row + 0.5) * (1.0 / group)).astype(jnp.int32)
        row_valid = (token >= q_start) & (token < q_end)  # [rows, 1]
        q_pos = kv_len - (q_end - token)
        first_t = jnp.maximum(q_start, blk * block_q)
        last_t = jnp.minimum(q_end, (blk + 1) * block_q) - 1
        lo, hi = kv_range(kv_len - (q_end - first_t), kv_len - (q_end - last_t), sliding_window)
        c_lo, c_hi = lo // block_kv, (hi + block_kv - 1) // block_kv

        def first_index(c):  # block c's first page in the flat page table
            return seq * pages_per_seq + c * pages_per_block

        def indices(c, slot):
            # The tile of the page table in HBM that holds block c's page indices, into SMEM
            # slot `slot` (a DMA starts at a whole tile; rows are padded so no block straddles two).
            window = idx.shape[1]
            start = pl.multiple_of(first_index(c) // window * window, window)
            return pltpu.make_async_copy(pages_hbm.at[pl.ds(start, window)], idx.at[slot], idx_sems.at[slot])

        def copies(slot, page=lambda i: 0):
            # Every page of the block is fetched (pages past the sequence's end are real,
            # masked pages, see the wrapper), so waits always match starts. A wait needs no
            # page index (only the semaphore and the size): waits use page 0.
            return [pltpu.make_async_copy(
                        kv_hbm.at[layer, :, page(i)],
                        buf.at[slot, :, pl.ds(i * kv_hbm.shape[3], kv_hbm.shape[3])], sems.at[slot])
                    for i in range(pages_per_block)]

        def start_pages(c, slot):
            offset = first_index(c) % idx.shape[1]
            for cp in copies(slot, lambda i: idx[slot, offset + i]):
                cp.start()

        # Indices run one block ahead of pages: block c + 1's are in SMEM before its pages
        # are fetched, and c + 2's arrive while c is computed.
        first = indices(c_lo, 0)
        first.start()
        first.wait()
        start_pages(c_lo, 0)

        @pl.when(c_lo + 1 < c_hi)
        def _():
            indices(c_lo + 1, 1).start()

        m_ref[...] = jnp.full(m_ref.shape, -1e30, jnp.float32)
        l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

        def body(c, _):
            slot = (c - c_lo) % 2

            @pl.when(c + 1 < c_hi)
            def _():
                indices(c + 1, 1 - slot).wait()
                start_pages(c + 1, 1 - slot)

                @pl.when(c + 2 < c_hi)
                def _():
                    indices(c + 2, slot).start()  # slot's indices were read when c's pages started

            for cp in copies(slot):
                cp.wait()
            kv_pos = c * block_kv + jax.lax.broadcasted_iota(jnp.int32, (1, block_kv), 1)
            mask = attention_mask(q_pos, kv_pos, row_valid, sliding_window)
            for h in range(num_kv_heads):
                # Lanes h * head_dim ...: head h of every token of the block's pages, a
                # contiguous load of any dtype (tokens on sublanes), its rows of 8 merged in
                # float32, whose vregs hold 8 rows. A quantized cache (int8, fp8) is converted
                # as loaded; its scales are the caller's.
                k, v = (as_elements(buf[slot, which, :, :, pl.ds(h * lanes, head_dim)], kv_dtype)
                        .astype(jnp.float32).reshape(block_kv, head_dim).astype(q_ref.dtype) for which in (0, 1))
                m, l, acc = softmax_update(
                    qk(q_ref[h], k, precision) * sm_scale, mask, m_ref[h][:, :1], l_ref[h][:, :1],
                    acc_ref[h], v, soft_cap=soft_cap, precision=precision)
                m_ref[h] = jnp.broadcast_to(m, (rows, _LANES))
                l_ref[h] = jnp.broadcast_to(l, (rows, _LANES))
                acc_ref[h] = acc
            return 0

        jax.lax.fori_loop(c_lo, c_hi, body, 0)
        for h in range(num_kv_heads):
            l = l_ref[h][:, :1]
            out = acc_ref[h] / jnp.where(l == 0.0, 1.0, l)
            o_ref[h] = jnp.where(row_valid, out.astype(o_ref.dtype), o_ref[h])


@functools.partial(jax.jit, static_argnames=("sm_scale", "soft_cap", "kv_dtype", "kv_layout", "block_q",
                                             "pages_per_block", "interpret", "vmem_limit_bytes"))
def ragged_paged_attention(
    q: jax.Array,             # [num_tokens, num_q_heads, head_dim]
    kv_cache: jax.Array,      # [num_layers, 2 (K, V), num_pages, page_size / 8, 8, num_kv_heads * padded_head_dim]
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
    kv_layout: str = "portable",
    block_q: int | None = None,
    pages_per_block: int | None = None,
    interpret=False,
    vmem_limit_bytes: int | None = None,
) -> jax.Array:
    """`interpret`: False on TPU; True (or a pltpu.InterpretParams) to run anywhere."""
    num_tokens, num_q_heads, head_dim = q.shape
    # kv_layout "tpu": the TPU platform's layout (platforms/tpu.py); the portable one
    # ([..., page_size, kv_heads, head_dim], the tests' and a CPU's) is padded into it here.
    kv = kv_cache
    if kv_layout == "portable":  # pages of fewer than 8 tokens (the tests') as one row group
        rows_per_tile = SUBLANES if kv.shape[3] % SUBLANES == 0 else kv.shape[3]
        kv = jnp.pad(kv, ((0, 0),) * 5 + ((0, padded_head_dim(head_dim) - head_dim),))
        kv = kv.reshape(kv.shape[:3] + (-1, rows_per_tile, kv.shape[4] * kv.shape[5]))
    num_pages, page_size = kv.shape[2], kv.shape[3] * kv.shape[4]
    num_kv_heads = kv.shape[5] // padded_head_dim(head_dim)
    group = num_q_heads // num_kv_heads
    # block_q * group rows per matmul, a multiple of 16 (bfloat16 sublane tiling).
    block_q = block_q or 16 * max(1, 8 // group)
    # ~128 KV tokens per DMA block.
    pages_per_block = pages_per_block or max(1, 128 // page_size)
    num_blocks = -(-num_tokens // block_q)
    padded = num_blocks * block_q
    rows = block_q * group

    qg = jnp.pad(q, ((0, padded - num_tokens), (0, 0), (0, 0)))
    qg = qg.reshape(padded, num_kv_heads, group, head_dim).transpose(1, 0, 2, 3)
    qg = qg.reshape(num_kv_heads, padded * group, head_dim)
    if pages_per_block & (pages_per_block - 1):
        raise ValueError(f"pages_per_block={pages_per_block}: a power of two (a block's page indices "
                         "must not straddle two tiles of the page table)")
    # The page table stays in HBM; the kernel reads a block's indices as the tile(s) holding
    # them. Rows are padded to whole tiles (so a block past a row's end fetches real, masked
    # pages) and indices clipped to real pages.
    idx_window = max(_IDX_TILE, pages_per_block)
    pages_per_seq = -(-page_indices.shape[1] // idx_window) * idx_window
    pages = jnp.pad(jnp.clip(page_indices, 0, num_pages - 1),
                    ((0, 0), (0, pages_per_seq - page_indices.shape[1]))).reshape(-1)
    block, seq, first = work_list(cu_q_lens, num_seqs, num_tokens, block_q)

    q_spec = pl.BlockSpec((num_kv_heads, rows, head_dim), lambda j, layer, kl, cu, blk, *_: (0, blk[j], 0))
    kernel = functools.partial(
        _kernel, block_q=block_q, group=group, page_size=page_size, pages_per_block=pages_per_block,
        pages_per_seq=pages_per_seq, sm_scale=sm_scale, windowed=sliding_window is not None,
        soft_cap=soft_cap, kv_dtype=kv_dtype, precision=precision_for(q.dtype))
    out = pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=6,
            grid=(block.shape[0],),
            in_specs=[q_spec, pl.BlockSpec(memory_space=pltpu.HBM), pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=q_spec,
            scratch_shapes=[
                pltpu.SMEM((2, idx_window), jnp.int32),
                pltpu.SemaphoreType.DMA((2,)),
                pltpu.VMEM((2, 2, pages_per_block * kv.shape[3]) + kv.shape[4:], kv.dtype),
                pltpu.SemaphoreType.DMA((2,)),
                pltpu.VMEM((num_kv_heads, rows, _LANES), jnp.float32),
                pltpu.VMEM((num_kv_heads, rows, _LANES), jnp.float32),
                pltpu.VMEM((num_kv_heads, rows, head_dim), jnp.float32),
            ]),
        out_shape=jax.ShapeDtypeStruct(qg.shape, q.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary",),
                                             vmem_limit_bytes=vmem_limit_bytes),
        interpret=interpret,
        name="ragged_paged_attention_tpu",
    )(layer_and_window(layer, sliding_window), kv_lens, cu_q_lens, block, seq, first, qg, pages, kv)

    out = out.reshape(num_kv_heads, padded, group, head_dim)[:, :num_tokens]
    return out.transpose(1, 0, 2, 3).reshape(num_tokens, num_q_heads, head_dim)
