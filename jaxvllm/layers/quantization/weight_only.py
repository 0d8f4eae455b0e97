"""Quantized matmul weights (vLLM's Fp8LinearMethod, AWQ / GPTQ / compressed-tensors linear
methods' meaning), stored as Qwix `QArray`s:

- quantized once at load from any float checkpoint (`quantization` int8 / fp8), one scale
  per output channel (qvalue [in, *out] int8 or float8_e4m3fn, scale [1, *out] float32): a
  quarter of float32's bytes. int8 scales map each channel's absolute maximum to 127.5
  (qwix's); fp8 scales are chosen by llm-compressor's `mse` observer (`_quantize_mse`);
- or a quantized checkpoint's weights as stored (its WeightScheme, scheme.py; read by
  transformers_utils/quantized_weight.py): 4- or 8-bit values, per-channel or group scales,
  zero points, act order. The linears it left in float (its head) stay float, as in vLLM.

quantized_matmul.py multiplies them (activations in the model's dtype, except a W8A8
checkpoint's, quantized per token to int8). A tied LM head is the float embedding: `apply`
multiplies a plain array as XLA's method does.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import qwix

from jaxvllm.layers.linear import UnquantizedLinearMethod
from jaxvllm.layers.quantization import verify_quantization
from jaxvllm.layers.quantization.quantized_matmul import is_quantized, quantized_matmul
from jaxvllm.layers.quantization.scheme import WeightScheme

# The `quantization`s that quantize float weights at load (layers/quantization/__init__.py)
# -> the dtype they quantize to; the others only keep a checkpoint's quantized weights.
WEIGHT_DTYPES = {"int8": jnp.int8, "fp8": jnp.float8_e4m3fn}


class WeightOnlyLinearMethod(UnquantizedLinearMethod):
    """x @ w with w a QArray: int8 / fp8 per output channel quantized at load, or a
    checkpoint's weights as stored (scheme: their format; quantized_matmul.py multiplies
    them). int4_bytes: what XLA stores a 4-bit value in on this device (half a byte on TPU
    and GPU, a byte on the CPU)."""

    def __init__(self, quantization: str, scheme: WeightScheme | None = None, int4_bytes: float = 0.5):
        verify_quantization(quantization)
        self.quantization, self.scheme, self.int4_bytes = quantization, scheme, int4_bytes
        self.qtype = WEIGHT_DTYPES.get(quantization) if scheme is None else None
        # A checkpoint keeps its head in float (every format that loads does).
        self.float_layers = ("lm_head",) if scheme is not None else ()

    def weight_bytes(self, in_features: int, out_shape: tuple[int, ...], dtype=None) -> int:
        out, s = math.prod(out_shape), self.scheme
        if s is None:  # 8-bit values, a float32 scale per output channel
            return in_features * out + out * 4
        value = in_features * out * (self.int4_bytes if s.bits == 4 else 1)
        scales = s.groups(in_features) * out * 4 * (1 + s.zero_point)
        return int(value) + scales + 4 * in_features * s.act_order

    def stored_form(self, w: jax.ShapeDtypeStruct):
        """The abstract weight as loaded and stored (compiling ahead of time holds this)."""
        s = self.scheme
        if s is None:
            return jax.eval_shape(self.process_weights_after_loading, w)
        scale = jax.ShapeDtypeStruct((s.groups(w.shape[0]), *w.shape[1:]), jnp.float32)
        q = qwix.QArray(jax.ShapeDtypeStruct(w.shape, jnp.dtype(s.qtype)), scale, scale if s.zero_point else None)
        return (q, jax.ShapeDtypeStruct((w.shape[0], *(1,) * (w.ndim - 1)), jnp.int32)) if s.act_order else q

    def process_weights_after_loading(self, w):
        if is_quantized(w) or self.qtype is None:  # quantized in the checkpoint, or left float
            return w
        # A weight on the mesh is quantized where it lies: the scale's max over the input
        # axis is XLA's (an all-reduce for a row-parallel weight).
        return quantize_weight(w, self.qtype, tuple(range(1, w.ndim)))

    def apply(self, x: jax.Array, w, num_rows: jax.Array | None = None) -> jax.Array:
        if not is_quantized(w):
            return super().apply(x, w, num_rows)
        return quantized_matmul(x, w, self.scheme and self.scheme.input_dtype)


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
