"""TPUs: the Mosaic Pallas attention kernel and megablox grouped matmul, bfloat16, no
conditionals in a step."""
from __future__ import annotations

from typing import Callable

from jaxvllm.platforms.interface import Platform


class TpuPlatform(Platform):
    device_name = "tpu"
    pallas_kernel = "tpu"
    # The Mosaic kernel DMAs one page of a chip's KV heads at a time and wants
    # page_size * kv_heads_per_chip to be a multiple of 16 in bfloat16.
    default_block_size = 32

    def ray_worker_resources(self, num_devices: int) -> dict[str, float]:
        return {"TPU": num_devices}

    def grouped_matmul(self) -> Callable:
        """Pallas megablox `gmm`, the grouped kernel written for the MXU (MaxText's and
        tpu-inference's choice)."""
        from jaxvllm.kernels.pallas.grouped_matmul_tpu import grouped_matmul
        return grouped_matmul
