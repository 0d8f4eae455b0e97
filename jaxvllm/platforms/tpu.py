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
    # Warm-up compiles one program at a time: two libtpu compiles at once in one process
    # crashed twice (a stack overflow on libtpu's own fiber thread, in its SparseCore code
    # generator: Llama-3.1-8B on v6e-4, Qwen3-8B on v6e-1), and every one-thread run of the
    # same programs finished (benchmarks/results/tpu-defaults-*.json). Start-up leans on the
    # persistent compilation cache instead.
    compile_threads = 1
    # Past the 128 MiB of VMEM a chip has (v5e, v6e): the step's temporaries are flat from
    # here on (memory_profiling.profile_num_blocks).
    profile_kv_cache_bytes = 1 << 30

    def ray_worker_resources(self, num_devices: int) -> dict[str, float]:
        return {"TPU": num_devices}
