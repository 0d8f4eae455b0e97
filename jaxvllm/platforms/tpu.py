"""TPUs: bfloat16, pages of 32 tokens, no conditionals in a step, and their own KV cache
layout (its shape and kernels: jaxvllm/backends/tpu.py)."""
from __future__ import annotations

from jaxvllm.platforms.interface import Platform


class TpuPlatform(Platform):
    device_name = "tpu"
    pallas_kernel = "tpu"
    # The kernel fetches 128 tokens of context per step, a DMA per page: pages of 32 make
    # 4 DMAs (pallas_kernels/ragged_paged_attention_tpu.py).
    default_block_size = 32
    kv_cache_layout = "tpu"

    def ray_worker_resources(self, num_devices: int) -> dict[str, float]:
        return {"TPU": num_devices}
