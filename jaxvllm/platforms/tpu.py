"""TPUs: the Mosaic Pallas attention kernel and megablox grouped matmul, bfloat16, no
conditionals in a step."""
from __future__ import annotations

from typing import Callable

from jaxvllm.platforms.interface import Platform


class TpuPlatform(Platform):
    device_name = "tpu"
    pallas_kernel = "tpu"
    # A page's tokens are the sublane axis of the cache (kv_cache_shape): a multiple of
    # the 8-bit sublane tile (32) keeps every KV dtype's pages whole tiles.
    default_block_size = 32

    def kv_cache_shape(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int,
                       head_dim: int) -> tuple[int, ...]:
        """A slot's heads packed along the last (lane) axis, each padded to whole 128-lane
        vregs: [..., block_size, kv_heads * padded_head_dim]. XLA tiles an array's last two
        axes, so this keeps tokens on sublanes and makes one head's K of a page a contiguous,
        lane-aligned slice, which Mosaic loads in any dtype (it refuses the strided sublane
        load that a [..., kv_heads, head_dim] page needs for 16- and 8-bit caches); every view
        the kernels take (pages or slots as rows) merges only leading axes, so none copies
        the pool; and with a last axis of whole vregs the TPU's default layout is this
        row-major one (for 3 heads of 64 it had put the blocks axis on lanes, and every step
        relaid the pool). The price: head_dim 64 takes twice its KV bytes. block_size must be
        a multiple of the dtype's sublane tile (16 for bfloat16, 32 for 8-bit)."""
        from pallas_kernels.ragged_paged_attention_tpu import padded_head_dim
        return (num_layers, 2, num_blocks, block_size, num_kv_heads * padded_head_dim(head_dim))

    def ray_worker_resources(self, num_devices: int) -> dict[str, float]:
        return {"TPU": num_devices}

    def grouped_matmul(self) -> Callable:
        """Pallas megablox `gmm`, the grouped kernel written for the MXU (MaxText's and
        tpu-inference's choice)."""
        from pallas_kernels.grouped_matmul_tpu import grouped_matmul
        return grouped_matmul
