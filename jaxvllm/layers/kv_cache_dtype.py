"""How the paged KV cache is stored (vLLM's `kv_cache_dtype`): the model dtype, fp8 (e4m3 or
e5m2) or int8, each K and V element x stored as quantize(x / scale) and read as
stored * scale.

The scales are fixed numbers per K and per V, the same for every layer and compiled into
the step, so no backend reads anything but the pages: K's scale folds into the softmax
scale and V's multiplies the attention output (layers/attention.py), and a kernel only
converts the page elements it loads to float. fp8 keeps vLLM's default scale of 1.0 (its
exponent covers K and V as they are: e4m3 up to 448, e5m2 up to 57344). int8 has no
exponent: its scales set the range, ±24 for K and ±16 for V, which covers the default
model's K and V with room to spare and steps of 0.19 and 0.13. A scale per token and head
would follow each vector's range, but needs a second cache array beside the pages in every
kernel, the KV write, the swap and the sharding; a fixed scale keeps the cache one array.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class KVCacheDtype:
    dtype: jnp.dtype   # what a page element is
    k_scale: float = 1.0
    v_scale: float = 1.0
    # Where XLA cannot update a sub-32-bit float array in place (the CPU: it converts the
    # whole cache through float32 on every write, bfloat16 and fp8 alike), the pages are
    # stored as their bits (uint16, uint8), and the kernels reinterpret what they load
    # (their `kv_dtype` argument).
    as_bits: bool = False

    @property
    def quantized(self) -> bool:
        return self.dtype in (jnp.int8, jnp.float8_e4m3fn, jnp.float8_e5m2)

    @property
    def storage(self) -> jnp.dtype:
        """The cache array's dtype."""
        return jnp.dtype(f"uint{8 * self.dtype.itemsize}") if self.as_bits else self.dtype

    @property
    def kernel_kv_dtype(self):
        """The kernels' `kv_dtype`: the element dtype of a cache stored as bits, else None."""
        return self.dtype if self.as_bits else None

    def quantize(self, x: jax.Array, scale: float) -> jax.Array:
        """x / scale in the stored dtype, clipped to its finite range (a cast to fp8 of a value
        past its largest gives NaN; int8 wraps)."""
        if not self.quantized:
            x = x.astype(self.dtype)
        elif self.dtype == jnp.int8:
            return jnp.clip(jnp.round(x.astype(jnp.float32) / scale), -127, 127).astype(jnp.int8)
        else:
            big = float(jnp.finfo(self.dtype).max)
            x = jnp.clip(x.astype(jnp.float32) / scale, -big, big).astype(self.dtype)
        return jax.lax.bitcast_convert_type(x, self.storage) if self.as_bits else x

    def dequantize(self, x: jax.Array, scale: float, dtype=jnp.float32) -> jax.Array:
        if self.as_bits:
            x = jax.lax.bitcast_convert_type(x, self.dtype)
        return x.astype(dtype) * scale if self.quantized else x.astype(dtype)


_INT8 = KVCacheDtype(jnp.dtype(jnp.int8), k_scale=24 / 127, v_scale=16 / 127)


def kv_cache_dtype(name: str, model_dtype, floats_as_bits: bool = False) -> KVCacheDtype:
    """The format for an EngineArgs.kv_cache_dtype name (validated in jaxvllm/config/);
    floats_as_bits: the platform's `kv_cache_floats_as_bits` (float32 is written in place
    everywhere and stays as it is)."""
    e4m3, e5m2 = jnp.dtype(jnp.float8_e4m3fn), jnp.dtype(jnp.float8_e5m2)
    model_dtype = jnp.dtype(model_dtype)
    formats = {"auto": KVCacheDtype(model_dtype, as_bits=floats_as_bits and model_dtype.itemsize < 4),
               "fp8": KVCacheDtype(e4m3, as_bits=floats_as_bits),
               "fp8_e4m3": KVCacheDtype(e4m3, as_bits=floats_as_bits),
               "fp8_e5m2": KVCacheDtype(e5m2, as_bits=floats_as_bits),
               "int8": _INT8}
    if name not in formats:
        raise ValueError(f"kv_cache_dtype must be one of {sorted(formats)}, got {name!r}.")
    return formats[name]
