"""Weight-only quantized matmuls (vLLM's Fp8LinearMethod / TPU int8 linear method meaning):
each matmul weight is quantized once at load, from any float checkpoint, with one scale per
output channel, and stored as a Qwix `QArray` (qvalue [in, *out] int8 or float8_e4m3fn,
scale [1, *out] float32), so a weight is a quarter of its float32 bytes.

Activations stay in the model dtype: the product is x @ qvalue in that dtype, times the
scale on the output. Scaling the [tokens, out] output instead of the [in, out] weight is
exact (the scale is constant along the contraction) and leaves XLA a plain convert feeding
the dot, which it fuses on TPU and GPU. A TPU's MXU also multiplies int8 natively and an
H100/H200 fp8, but only with quantized activations too (w8a8), which this is not.

A tied LM head is the float embedding: `apply` multiplies a plain array as XLA's method does.
A pre-quantized checkpoint (`quantization="compressed-tensors"`, compressed_tensors.py) brings
its weights as QArrays already (quantized_weight.py), kept as they are; the linears its
`ignore` list left in float stay float, as in vLLM.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import qwix

from jaxvllm.layers.linear import UnquantizedLinearMethod

# vLLM's `quantization` names -> the dtype float weights are quantized to at load (None: the
# checkpoint's own 8-bit weights only).
WEIGHT_DTYPES = {"int8": jnp.int8, "fp8": jnp.float8_e4m3fn, "compressed-tensors": None}


class WeightOnlyLinearMethod(UnquantizedLinearMethod):
    """x @ w with w an int8 / fp8 QArray, per-output-channel scales."""

    def __init__(self, quantization: str):
        if quantization not in WEIGHT_DTYPES:
            raise ValueError(f"quantization must be one of {sorted(WEIGHT_DTYPES)}, got {quantization!r}.")
        self.quantization = quantization
        self.qtype = WEIGHT_DTYPES[quantization]

    def weight_bytes(self, in_features: int, out_shape: tuple[int, ...], dtype=None) -> int:
        out = math.prod(out_shape)
        return in_features * out + out * 4  # 8-bit values, a float32 scale per output channel

    def process_weights_after_loading(self, w: jax.Array | qwix.QArray) -> jax.Array | qwix.QArray:
        if isinstance(w, qwix.QArray) or self.qtype is None:  # quantized in the checkpoint, or left float
            return w
        # A weight on the mesh is quantized where it lies: the scale's max over the input
        # axis is XLA's (an all-reduce for a row-parallel weight).
        return _quantize(w, self.qtype)

    def apply(self, x: jax.Array, w, num_rows: jax.Array | None = None) -> jax.Array:
        if not isinstance(w, qwix.QArray):
            return super().apply(x, w, num_rows)
        y = jax.lax.dot_general(x, w.qvalue.astype(x.dtype), (((x.ndim - 1,), (0,)), ((), ())))
        return y * w.scale[0].astype(x.dtype)


@jax.jit(static_argnums=1)
def _quantize(w: jax.Array, qtype) -> qwix.QArray:
    return qwix.quantize(w.astype(jnp.float32), qtype, channelwise_axes=tuple(range(1, w.ndim)))
