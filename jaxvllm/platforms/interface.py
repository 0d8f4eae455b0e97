"""Platform: the facts and defaults that differ by device kind, in one object (vLLM's
vllm/platforms/interface.py). Which kernels run is the backend's (jaxvllm/backends), chosen
from these facts and the engine's config.

The base class holds the accelerators' values (TPU and GPU are the targets); cpu.py
overrides what differs on the CPU. This module imports no JAX: the engine's configuration
reads the defaults below in processes that never start a device.
"""
from __future__ import annotations

import os


class Platform:
    device_name: str  # vLLM's name, also jax.export's: "cpu", "cuda", "tpu"
    # The Pallas attention kernel this device compiles ("tpu": Mosaic, "gpu": Triton); the
    # other one, or either on a CPU, runs in interpret mode.
    pallas_kernel: str | None = None

    # Engine defaults, where the user sets none: vLLM's on an accelerator.
    default_dtype = "bfloat16"
    default_block_size = 16
    default_max_num_seqs = 256
    default_max_num_batched_tokens = 2048
    default_max_model_len: int | None = None  # None: the model's max_position_embeddings
    default_kv_cache_memory_bytes: int | None = None  # None: hbm_utilization of device memory
    min_token_bucket = 16  # matmuls are tiled: smaller token buckets save nothing
    # Schedule step n + 1 while the device runs step n (EngineArgs.async_scheduling).
    default_async_scheduling = True

    # Whether a compiled step may hold lax.cond / lax.switch. On XLA:GPU a conditional copies
    # its predicate to the host and waits; on a TPU it hides the step's structure from XLA's
    # scheduling of collectives and weight prefetch. Where False, the sampler's variants are
    # separate programs chosen on the host.
    step_may_branch = False
    # Warm-up compiles the programs not found on disk on this many threads
    # (worker/compiled_programs.warm_all): an accelerator's host has cores to spare at start-up.
    compile_threads = min(8, os.cpu_count() or 1)
    # The smallest KV pool per device the memory profile compiles against
    # (worker/memory_profiling.profile_num_blocks): where the compiler may keep a small pool
    # on chip, a step's temporaries are only what serving will see beside a larger one.
    profile_kv_cache_bytes = 0
    # Save warmed step programs as serialized executables (worker/compiled_programs.py), and
    # back weights and KV cache with huge pages: measured to pay on the CPU only.
    serialize_executables = False
    huge_pages = False
    # Store a bfloat16 / float16 / fp8 KV cache as its bits (uint16, uint8), for an XLA that
    # updates such arrays by converting them whole (layers/kv_cache_dtype.py).
    kv_cache_floats_as_bits = False

    # The KV cache's layout, which its shape (Backend.kv_cache_shape), the KV write, the
    # kernels and the sharding read (distributed/partition.kv_cache_spec): "portable", or
    # "tpu" (backends/tpu.py).
    kv_cache_layout = "portable"

    def ray_worker_resources(self, num_devices: int) -> dict[str, float]:
        """What a Ray worker actor driving `num_devices` devices reserves in its placement
        group bundle (Ray then makes those devices visible to it)."""
        return {"GPU": num_devices}

    def worker_device_env(self, num_devices: int) -> dict[str, str]:
        """Environment a worker process needs to drive `num_devices` devices, set before
        its JAX starts."""
        return {}

    def device_memory(self, device) -> tuple[int, int] | None:
        """(bytes the device may hold, bytes in use), or None where the backend does not say."""
        stats = device.memory_stats() or {}
        if "bytes_limit" not in stats:
            return None
        return stats["bytes_limit"], stats.get("bytes_in_use", 0)
