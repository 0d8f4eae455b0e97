"""The TPU's backend: the Mosaic Pallas attention kernel over the TPU's KV cache layout, and
megablox `gmm` for the experts."""
from __future__ import annotations

from typing import Callable

from jaxvllm.backends.backend import Backend


class TpuBackend(Backend):
    def kv_cache_shape(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int,
                       head_dim: int) -> tuple[int, ...]:
        """[layers, 2, blocks, block_size / 8, 8, kv_heads * padded_head_dim]: a page's tokens
        in rows of 8, a slot's heads packed along the last (lane) axis, each padded to whole
        128-lane vregs (with a last axis of whole vregs XLA's default layout is this row-major
        one: for 3 heads of 64 it had put the blocks axis on lanes and relaid the pool).

        XLA tiles an array's last two axes. With 8 there, its tiles are (8, 128) for every
        dtype, the tiles its scatter (the KV write) updates in place; a [..., block_size,
        lanes] int8 or fp8 pool is tiled (32, 128), so wider than one vreg of lanes it was
        relaid to (8, 128) and back around every step's write, a pool-sized temporary. Tokens
        stay on sublanes and one head's K of a page is a contiguous lane-aligned slice, which
        Mosaic loads in any dtype (it refuses the strided sublane load a [..., kv_heads,
        head_dim] page needs for 16- and 8-bit caches); every view the kernels take merges
        only leading axes, so none copies the pool. The price: head_dim 64 takes twice its KV
        bytes. Every block_size allowed (8 to 256) is a multiple of 8."""
        from pallas_kernels.ragged_paged_attention_tpu import SUBLANES, padded_head_dim
        return (num_layers, 2, num_blocks, block_size // SUBLANES, SUBLANES, num_kv_heads * padded_head_dim(head_dim))

    def grouped_matmul(self) -> Callable:
        """Pallas megablox `gmm`, the grouped kernel written for the MXU (MaxText's and
        tpu-inference's choice)."""
        from pallas_kernels.grouped_matmul_tpu import grouped_matmul
        return grouped_matmul
