"""The XLA contract of quantized weights, correct on every device: x @ w for a Qwix `QArray`
w [in, *out] (values, scale [groups, *out], zero point or None) and w's dequantized form for
kernels that take float operands. A backend's kernel (Pallas on TPU, the CPU's native one)
must agree with these.

Per output channel (one group), the scale and zero point are constant along the contraction:
y = (x @ q - sum(x) * zero) * scale, exact, so the product reads q converted in the dot's
operand and scales the [tokens, out] output. With groups, each group's scale differs along
the contraction: the weight is dequantized, ((q - zero) * scale), into the dot's operand
(XLA fuses the conversion into the dot on TPU and GPU; a kernel reads q directly).
With act order the weight is held as (QArray, perm): x's features gathered by perm first.
W8A8: x quantized per token to int8 (absolute maximum -> 127), an int8 x int8 -> int32 dot,
then both scales.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import qwix


def is_quantized(w) -> bool:
    return isinstance(w, qwix.QArray) or (isinstance(w, tuple) and isinstance(w[0], qwix.QArray))


def split_act_order(w):
    """(QArray, perm [in] or None)."""
    return (w[0], w[1].reshape(-1)) if isinstance(w, tuple) else (w, None)


def dequantize(w: qwix.QArray, dtype, in_axis: int = 0) -> jax.Array:
    """(q - zero) * scale in dtype, in w's shape; the groups lie along in_axis."""
    groups = w.scale.shape[in_axis]
    k = w.shape[in_axis]
    split = (*w.shape[:in_axis], groups, k // groups, *w.shape[in_axis + 1:])

    def per_group(a):
        return jnp.expand_dims(a.astype(dtype), in_axis + 1)

    q = w.qvalue.astype(dtype).reshape(split)
    if w.zero_point is not None:
        q = q - per_group(w.zero_point)
    return (q * per_group(w.scale)).reshape(w.shape)


def embedding_rows(table, ids: jax.Array, dtype) -> jax.Array:
    """table[ids] in dtype; a quantized table (a GGUF's kept embedding, [vocab, hidden] with
    its groups along hidden) is dequantized for those rows only."""
    if not isinstance(table, qwix.QArray):
        return table[ids]
    return dequantize(jax.tree.map(lambda a: a[ids], table), dtype, in_axis=1)


def quantized_matmul(x: jax.Array, w, input_dtype: str | None = None) -> jax.Array:
    """x [..., in] @ w -> [..., *out] in x's dtype."""
    w, perm = split_act_order(w)
    if perm is not None:
        x = jnp.take(x, perm, axis=-1)
    dims = (((x.ndim - 1,), (0,)), ((), ()))
    if w.scale.shape[0] > 1:
        return jax.lax.dot_general(x, dequantize(w, x.dtype), dims)
    if input_dtype == "int8" and w.qvalue.dtype == jnp.int8 and w.zero_point is None:
        return _int8_matmul(x, w, dims)
    y = jax.lax.dot_general(x, w.qvalue.astype(x.dtype), dims)
    if w.zero_point is not None:
        rows = jnp.sum(x, axis=-1).reshape(*x.shape[:-1], *(1,) * (w.ndim - 1))
        y = y - rows * w.zero_point[0].astype(x.dtype)
    return y * w.scale[0].astype(x.dtype)


def _int8_matmul(x: jax.Array, w: qwix.QArray, dims) -> jax.Array:
    x32 = x.astype(jnp.float32)
    x_scale = jnp.max(jnp.abs(x32), axis=-1, keepdims=True) / 127
    x_q = jnp.round(x32 / jnp.where(x_scale == 0, 1, x_scale)).astype(jnp.int8)
    acc = jax.lax.dot_general(x_q, w.qvalue, dims, preferred_element_type=jnp.int32)
    x_scale = x_scale.reshape(*x.shape[:-1], *(1,) * (w.ndim - 1))
    return (acc.astype(jnp.float32) * x_scale * w.scale[0]).astype(x.dtype)
