"""Weight-only quantized matmuls (vLLM's Fp8LinearMethod / TPU int8 linear method meaning):
each matmul weight is quantized once at load, from any float checkpoint, with one scale per
output channel, and stored as a Qwix `QArray` (qvalue [in, *out] int8 or float8_e4m3fn,
scale [1, *out] float32), so a weight is a quarter of its float32 bytes. int8 scales map each
channel's absolute maximum to 127.5 (qwix's); fp8 scales are chosen by llm-compressor's `mse`
observer (`_quantize_mse`).

Activations stay in the model dtype: the product is x @ qvalue in that dtype, times the
scale on the output. Scaling the [tokens, out] output instead of the [in, out] weight is
exact (the scale is constant along the contraction) and leaves XLA a plain convert feeding
the dot, which it fuses on TPU and GPU. A TPU's MXU also multiplies int8 natively and an
H100/H200 fp8, but only with quantized activations too (w8a8), which this is not.

A tied LM head is the float embedding: `apply` multiplies a plain array as XLA's method does.
A pre-quantized checkpoint (`quantization="compressed-tensors"`, compressed_tensors.py) brings
its weights as QArrays already (transformers_utils/quantized_weight.py), kept as they are; the linears its
`ignore` list left in float stay float, as in vLLM.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import qwix

from jaxvllm.layers.linear import UnquantizedLinearMethod
from jaxvllm.layers.quantization import verify_quantization
from jaxvllm.layers.quantization.compressed_tensors import QUANT_METHOD

# Each `quantization` (the registry: layers/quantization/__init__.py) -> the dtype float weights
# are quantized to at load (None: the checkpoint's own 8-bit weights only).
WEIGHT_DTYPES = {"int8": jnp.int8, "fp8": jnp.float8_e4m3fn, QUANT_METHOD: None}


class WeightOnlyLinearMethod(UnquantizedLinearMethod):
    """x @ w with w an int8 / fp8 QArray, per-output-channel scales."""

    def __init__(self, quantization: str):
        verify_quantization(quantization)
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
        return quantize_weight(w, self.qtype, tuple(range(1, w.ndim)))

    def apply(self, x: jax.Array, w, num_rows: jax.Array | None = None) -> jax.Array:
        if not isinstance(w, qwix.QArray):
            return super().apply(x, w, num_rows)
        y = jax.lax.dot_general(x, w.qvalue.astype(x.dtype), (((x.ndim - 1,), (0,)), ((), ())))
        return y * w.scale[0].astype(x.dtype)


def quantize_weight(w: jax.Array, qtype, channelwise_axes: tuple[int, ...]) -> qwix.QArray:
    """w quantized with one scale per index of channelwise_axes (the other axes reduced)."""
    if qtype == jnp.float8_e4m3fn:
        return _quantize_mse(w, qtype, channelwise_axes)
    return _quantize_absmax(w, qtype, channelwise_axes)


@jax.jit(static_argnums=(1, 2))
def _quantize_absmax(w: jax.Array, qtype, channelwise_axes: tuple[int, ...]) -> qwix.QArray:
    return qwix.quantize(w.astype(jnp.float32), qtype, channelwise_axes=channelwise_axes)


# llm-compressor's `mse` observer: the absmax shrunk by 1 - i / GRID (i < MAXSHRINK * GRID)
# whose round trip has the least sum of |error| ** NORM, per channel; it stops after PATIENCE
# shrinks that improve no channel.
GRID, MAXSHRINK, NORM, PATIENCE = 100, 0.2, 2.4, 5


@jax.jit(static_argnums=(1, 2))
def _quantize_mse(w: jax.Array, qtype, channelwise_axes: tuple[int, ...]) -> qwix.QArray:
    """fp8 scales by llm-compressor's `mse` observer instead of the absolute maximum: e4m3's
    error is relative to each value (3 mantissa bits), so where the largest values land on
    its grid decides much of a channel's error (benchmarks/weight_sensitivity.py measures it).
    Each candidate is quantized as qwix.quantize does (clip to e4m3's range, convert)."""
    w = w.astype(jnp.float32)
    reduce = tuple(a for a in range(w.ndim) if a not in channelwise_axes)
    absmax = jnp.max(jnp.abs(w), axis=reduce, keepdims=True)
    qmax = float(jnp.finfo(qtype).max)

    def candidate(i):
        scale = absmax * (1 - i / GRID) / qmax
        scale = jnp.where(scale == 0, 1, scale)
        q = jnp.clip(w / scale, -qmax, qmax).astype(qtype)
        return q, scale, jnp.sum(jnp.abs(q.astype(jnp.float32) * scale - w) ** NORM, axis=reduce, keepdims=True)

    def step(carry):
        i, stale, best_q, best_scale, best_err = carry
        q, scale, err = candidate(i)
        better = err < best_err
        return (i + 1, jnp.where(better.any(), 0, stale + 1), jnp.where(better, q, best_q),
                jnp.where(better, scale, best_scale), jnp.where(better, err, best_err))

    def more(carry):
        i, stale = carry[:2]
        return (i < int(MAXSHRINK * GRID)) & (stale < PATIENCE)

    _, _, best_q, best_scale, _ = jax.lax.while_loop(more, step, (jnp.int32(1), jnp.int32(0), *candidate(0)))
    return qwix.QArray(best_q, best_scale)
