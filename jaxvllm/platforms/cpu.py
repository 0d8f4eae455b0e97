"""The CPU: where jaxvllm is developed and tested, and must stay fast.

float32 by default (a bfloat16 model, its weights packed in row pairs for AVX-512's bfloat16
dot product, its sums in float32 and its pages read by the native attention, embeds and
decodes about 1.5x as fast where the CPU has bfloat16 dot units), small buckets and KV cache
(warm-up is one compile per bucket), conditionals allowed in a step, and the caches that pay
on a host: serialized step programs and huge pages. Its kernels: jaxvllm/backends/cpu.py.
"""
from __future__ import annotations

import os

from jaxvllm.platforms.interface import Platform


class CpuPlatform(Platform):
    device_name = "cpu"
    default_dtype = "float32"
    default_max_num_seqs = 32
    default_max_num_batched_tokens = 512
    default_max_model_len = 2048
    default_kv_cache_memory_bytes = 1 << 30
    min_token_bucket = 4  # every padded row costs time: small decode batches get small buckets
    step_may_branch = True
    serialize_executables = True
    huge_pages = True
    # The CPU is the device too: its warm-up compiles on one thread (see compile_threads).
    compile_threads = 1
    # XLA:CPU writes into a bfloat16 or fp8 array by converting all of it through float32
    # (a bfloat16 model's step converted its whole pool twice: 8x slower than float32).
    kv_cache_floats_as_bits = True

    def ray_worker_resources(self, num_devices: int) -> dict[str, float]:
        return {"CPU": 1}

    def worker_device_env(self, num_devices: int) -> dict[str, str]:
        """Simulated devices: a CPU worker sees as many as it is to drive."""
        flag = "--xla_force_host_platform_device_count"
        kept = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith(flag)]
        return {"XLA_FLAGS": " ".join(kept + [f"{flag}={num_devices}"])}
