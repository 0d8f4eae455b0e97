"""Platform: what differs by device kind, in one object (vLLM's vllm/platforms/interface.py).

The base class holds the accelerator choices (TPU and GPU are the targets); cpu.py overrides
what the CPU does differently. This module imports no JAX: the engine's configuration reads
the defaults below in processes that never start a device.
"""
from __future__ import annotations

import functools
import os
from typing import Callable

ATTENTION_BACKENDS = ("xla", "native", "pallas", "pallas-tpu", "pallas-gpu")


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
    # Save warmed step programs as serialized executables (worker/compiled_programs.py), and
    # back weights and KV cache with huge pages: measured to pay on the CPU only.
    serialize_executables = False
    huge_pages = False
    # Store a bfloat16 / float16 / fp8 KV cache as its bits (uint16, uint8), for an XLA that
    # updates such arrays by converting them whole (layers/kv_cache_dtype.py).
    kv_cache_floats_as_bits = False

    # The layout of kv_cache_shape, which the KV write, the kernels and the sharding read
    # (distributed/partition.kv_cache_spec): "portable" or "tpu" (platforms/tpu.py).
    kv_cache_layout = "portable"

    def kv_cache_shape(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int,
                       head_dim: int) -> tuple[int, ...]:
        """The KV cache array's shape: [layers, 2 (K, V), blocks, block_size, kv_heads,
        head_dim]. A platform's own layout keeps the blocks axis third (swap, prefix pages,
        KV transfer copy whole blocks) and a slot's K (or V) last."""
        return (num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim)

    def attention_kernel(self, backend: str) -> tuple[str, bool]:
        """(kernel, interpret) for an `attention_backend`: kernel is `xla`, `native`,
        `tpu` or `gpu`; `auto` picks this platform's fastest."""
        if backend not in ("auto",) + ATTENTION_BACKENDS:
            raise ValueError(f"attention_backend must be one of {('auto',) + ATTENTION_BACKENDS}, "
                             f"got {backend!r}.")
        if backend == "auto":
            backend = self.auto_attention_backend()
        if backend == "native":
            self.load_native_kernels()
            return "native", False
        if backend == "xla":
            return "xla", False
        kernel = backend.removeprefix("pallas-") if backend != "pallas" else self.pallas_kernel or "tpu"
        return kernel, kernel != self.pallas_kernel

    def attention_impl(self, backend: str) -> Callable:
        """The kernel function an `attention_backend` resolves to (the contract of
        jaxvllm/kernels/xla/ragged_paged_attention.py), its module imported only here."""
        kernel, interpret = self.attention_kernel(backend)
        if kernel == "xla":
            from jaxvllm.kernels.xla.ragged_paged_attention import ragged_paged_attention
            return functools.partial(ragged_paged_attention, kv_layout=self.kv_cache_layout)
        from pallas_kernels import ragged_paged_attention_gpu, ragged_paged_attention_tpu
        if kernel == "tpu":
            return functools.partial(ragged_paged_attention_tpu.ragged_paged_attention, interpret=interpret,
                                     kv_layout=self.kv_cache_layout)
        return functools.partial(ragged_paged_attention_gpu.ragged_paged_attention, interpret=interpret)

    def auto_attention_backend(self) -> str:
        return "pallas"

    def load_native_kernels(self) -> None:
        raise ValueError(f"attention_backend='native' runs on the CPU only, not on {self.device_name!r}.")

    def linear_method(self, attention_backend: str, num_devices: int, quantization: str | None = None,
                      dtype: str = "float32"):
        """How the model's matmuls run and store their weights (jaxvllm/layers/linear.py):
        XLA's; with `quantization`, int8 / fp8 weights dequantized into XLA's dot
        (jaxvllm/layers/quantization/weight_only.py). dtype: the model's."""
        if quantization is not None:
            from jaxvllm.layers.quantization.weight_only import WeightOnlyLinearMethod
            return WeightOnlyLinearMethod(quantization)
        from jaxvllm.layers.linear import UnquantizedLinearMethod
        return UnquantizedLinearMethod()

    def fused_moe_method(self, quantization: str | None = None, attention_backend: str = "auto",
                         num_devices: int = 1):
        """How a mixture-of-experts layer runs its experts (jaxvllm/layers/fused_moe.py): the
        platform's grouped matmul over the token copies sorted by expert; with `quantization`,
        8-bit experts (jaxvllm/layers/quantization/weight_only_moe.py). attention_backend and
        num_devices as for `linear_method`."""
        if quantization is not None:
            from jaxvllm.layers.quantization.weight_only_moe import WeightOnlyFusedMoEMethod
            return WeightOnlyFusedMoEMethod(quantization, self.grouped_matmul())
        from jaxvllm.layers.fused_moe import UnquantizedFusedMoEMethod
        return UnquantizedFusedMoEMethod(self.grouped_matmul())

    def grouped_matmul(self) -> Callable:
        """The experts' grouped matmul (contract: jaxvllm/layers/fused_moe.py): XLA's `ragged_dot`."""
        import jax
        return jax.lax.ragged_dot

    def sampler_argmax(self) -> Callable:
        """The sampler's argmax over the vocabulary, x [R, V] -> the first index of each row's
        maximum, i32[R]: XLA's argmax reduction."""
        from jaxvllm.worker.sampler import first_argmax
        return first_argmax

    @property
    def layer_loop(self) -> Callable:
        """How the model runs its layers: unrolled in Python, one static layer index each,
        so the step holds no loop or conditional (what tpu-inference, sglang-jax and
        MaxText's serving path do)."""
        from jaxvllm.models.layer_loops import unrolled_layers
        return unrolled_layers

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
