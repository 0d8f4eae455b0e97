"""The CPU's backend: where the CPU has AVX-512, the native C++ kernels (jaxvllm/kernels/cpu)
for attention and, beside it on one device, packed matmuls for the layers and the experts;
an argmax of block maxima for the sampler; a grouped matmul for the experts that skips the
pairs of row tile and expert holding no rows; and the layers in a `fori_loop` +
`lax.switch` (a conditional costs nothing here, and the attention compiles once instead of
once per layer).
"""
from __future__ import annotations

import functools
from typing import Callable

import jax.numpy as jnp

from jaxvllm.backends.backend import Backend
from jaxvllm.kernels.cpu import build
from jaxvllm.kernels.xla.argmax import blocked_argmax
from jaxvllm.kernels.xla.grouped_matmul import grouped_matmul
from jaxvllm.layers.linear import UnquantizedLinearMethod
from jaxvllm.layers.quantization.scheme import WeightScheme
from jaxvllm.models.layer_loops import switched_layers


@functools.cache
def has_avx512() -> bool:
    """The native kernels' 16-float vectors and register tiles are written for 512-bit
    units; on an AVX2-only CPU their packed matmul ran ~20x slower than XLA's."""
    return "avx512f" in build.cpu_features().split()


def native_kernels_available() -> bool:
    """Whether `auto` picks the native kernels here (a machine that cannot build them logs why)."""
    return has_avx512() and build.available()


class CpuBackend(Backend):
    # One `fori_loop` over the layers whose body picks each layer's weights with
    # `lax.switch`: the attention compiles once, and every matmul reads its weights where
    # they lie (stacked weights under `lax.scan` compile as fast, but XLA on CPU copies each
    # layer's weights out of the stack every step; unrolled, the attention compiles once per
    # layer).
    layer_loop = staticmethod(switched_layers)
    # Block maxima first, then the index within one block per row (kernels/xla/argmax.py):
    # XLA:CPU's argmax reduction is not vectorized.
    sampler_argmax = staticmethod(blocked_argmax)

    def auto_attention_backend(self) -> str:
        return "native" if native_kernels_available() else "xla"

    def native_attention(self) -> tuple[str, bool]:
        build.load()  # a machine that cannot build them says why, here
        return "native", False

    def load_attention_kernel(self) -> Callable:
        if self.attention_kernel == "native":
            from jaxvllm.kernels.cpu.ragged_paged_attention import ragged_paged_attention
            return ragged_paged_attention
        return super().load_attention_kernel()

    # XLA:CPU stores a 4-bit value in a byte.
    int4_bytes = 1

    def get_linear_method(self, quantization: str | None, dtype: str, num_devices: int,
                          scheme: WeightScheme | None = None):
        """The native packed matmul beside the native attention, on one device (packed
        weights are not sharded), for a float32 or bfloat16 model; else XLA's, a bfloat16 or
        float16 model's dots accumulating in float32 (4x faster on XLA:CPU than a bfloat16
        result). Quantized weights run through XLA (the packed kernel takes float panels only)."""
        if quantization is None:
            if self.packs(num_devices) and jnp.dtype(dtype) in (jnp.float32, jnp.bfloat16):
                from jaxvllm.layers.packed_linear import PackedLinearMethod
                return PackedLinearMethod()
            if jnp.dtype(dtype) != jnp.float32:
                return UnquantizedLinearMethod(accumulate_dtype=jnp.float32)
        return super().get_linear_method(quantization, dtype, num_devices, scheme)

    def get_moe_method(self, quantization: str | None, num_devices: int, scheme: WeightScheme | None = None):
        """Float32 experts packed for the native grouped kernel where the linear method packs
        (one device, native kernels); else the base's, over `grouped_matmul`."""
        if self.packs(num_devices) and quantization is None:
            from jaxvllm.layers.packed_linear import PackedFusedMoEMethod
            return PackedFusedMoEMethod(self.grouped_matmul())
        return super().get_moe_method(quantization, num_devices, scheme)

    def packs(self, num_devices: int) -> bool:
        """The packed methods go with the native attention, on one device."""
        return self.attention_kernel == "native" and num_devices == 1

    def grouped_matmul(self) -> Callable:
        """A loop over the (row tile, expert) pairs that hold rows
        (jaxvllm/kernels/xla/grouped_matmul.py): XLA:CPU lowers ragged_dot to every row times
        every expert, masked."""
        return grouped_matmul
