"""The CPU: where jaxvllm is developed and tested, and must stay fast.

float32 by default (a bfloat16 model, its weights packed in row pairs for AVX-512's bfloat16
dot product, its sums in float32 and its pages read by the native attention, embeds and
decodes about 1.5x as fast where the CPU has bfloat16 dot units), small buckets and KV cache (warm-up is one
compile per bucket), the native C++ kernels (jaxvllm/kernels/cpu) for attention and packed matmuls
where the CPU has AVX-512, an argmax of block maxima for the sampler, a grouped matmul for the
experts that skips the pairs of row tile and expert holding no rows, the layers in a
`fori_loop` + `lax.switch` (a conditional costs nothing here, and the attention compiles once
instead of once per layer), and the caches that pay on a host: serialized step programs and
huge pages.
"""
from __future__ import annotations

import functools
import os
from typing import Callable

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

    def auto_attention_backend(self) -> str:
        from jaxvllm.kernels.cpu import build
        return "native" if self.has_avx512 and build.available() else "xla"

    @functools.cached_property
    def has_avx512(self) -> bool:
        """The native kernels' 16-float vectors and register tiles are written for 512-bit
        units; on an AVX2-only CPU their packed matmul ran ~20x slower than XLA's."""
        from jaxvllm.kernels.cpu import build
        return "avx512f" in build.cpu_features().split()

    def load_native_kernels(self) -> None:
        from jaxvllm.kernels.cpu import build
        build.load()  # a machine that cannot build them says why, here

    def attention_impl(self, backend: str) -> Callable:
        if self.attention_kernel(backend)[0] == "native":
            from jaxvllm.kernels.cpu.ragged_paged_attention import ragged_paged_attention
            return ragged_paged_attention
        return super().attention_impl(backend)

    def linear_method(self, attention_backend: str, num_devices: int, quantization: str | None = None,
                      dtype: str = "float32"):
        """The native packed matmul beside the native attention, on one device (packed
        weights are not sharded), for a float32 or bfloat16 model; else XLA's, a bfloat16 or
        float16 model's dots accumulating in float32 (4x faster on XLA:CPU than a bfloat16
        result). Quantized weights run through XLA (the packed kernel takes float panels only)."""
        import jax.numpy as jnp
        native = self.attention_kernel(attention_backend)[0] == "native" and num_devices == 1
        if quantization is None:
            if native and jnp.dtype(dtype) in (jnp.float32, jnp.bfloat16):
                from jaxvllm.kernels.cpu.packed_matmul import PackedLinearMethod
                return PackedLinearMethod()
            if jnp.dtype(dtype) != jnp.float32:
                from jaxvllm.layers.linear import UnquantizedLinearMethod
                return UnquantizedLinearMethod(accumulate_dtype=jnp.float32)
        return super().linear_method(attention_backend, num_devices, quantization, dtype)

    def fused_moe_method(self, quantization: str | None = None, attention_backend: str = "auto",
                         num_devices: int = 1):
        """Float32 experts packed for the native grouped kernel where the linear method packs
        (one device, native kernels); else the base's, over `grouped_matmul`."""
        if (self.attention_kernel(attention_backend)[0] == "native" and num_devices == 1
                and quantization is None):
            from jaxvllm.kernels.cpu.packed_matmul import PackedFusedMoEMethod
            return PackedFusedMoEMethod(self.grouped_matmul())
        return super().fused_moe_method(quantization, attention_backend, num_devices)

    def grouped_matmul(self) -> Callable:
        """A loop over the (row tile, expert) pairs that hold rows
        (jaxvllm/kernels/xla/grouped_matmul.py): XLA:CPU lowers ragged_dot to every row times
        every expert, masked."""
        from jaxvllm.kernels.xla.grouped_matmul import grouped_matmul
        return grouped_matmul

    def sampler_argmax(self) -> Callable:
        """Block maxima first, then the index within one block per row
        (jaxvllm/kernels/xla/argmax.py): XLA:CPU's argmax reduction is not vectorized."""
        from jaxvllm.kernels.xla.argmax import blocked_argmax
        return blocked_argmax

    @property
    def layer_loop(self) -> Callable:
        """One `fori_loop` over the layers whose body picks each layer's weights with
        `lax.switch`: the attention compiles once, and every matmul reads its weights where
        they lie (stacked weights under `lax.scan` compile as fast, but XLA on CPU copies each
        layer's weights out of the stack every step; unrolled, the attention compiles once per
        layer)."""
        from jaxvllm.models.layer_loops import switched_layers
        return switched_layers

    def ray_worker_resources(self, num_devices: int) -> dict[str, float]:
        return {"CPU": 1}

    def worker_device_env(self, num_devices: int) -> dict[str, str]:
        """Simulated devices: a CPU worker sees as many as it is to drive."""
        flag = "--xla_force_host_platform_device_count"
        kept = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith(flag)]
        return {"XLA_FLAGS": " ".join(kept + [f"{flag}={num_devices}"])}
