"""The grouped matmul of the mixture-of-experts layer on a TPU: JAX's Pallas megablox `gmm`
(Mosaic), with tiles fitted to the problem.

Same contract as `jax.lax.ragged_dot(lhs [m, k], rhs [groups, k, n], group_sizes)`, except that
rows past the last group are left unwritten (the caller drops them). megablox needs m to divide
by the row tile: the engine's token buckets are powers of two, times top_k.
"""
from __future__ import annotations

import math

import jax
from jax.experimental.pallas.ops.tpu.megablox import gmm

TILE = 128  # rows, and contraction / output columns, per MXU pass (megablox's default)


def grouped_matmul(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array, *,
                   interpret: bool = False) -> jax.Array:
    m, k = lhs.shape
    n = rhs.shape[2]
    tiling = (math.gcd(m, TILE), min(k, TILE), min(n, TILE))
    # megablox multiplies float32 or bfloat16 only: 8-bit experts are converted before it.
    return gmm(lhs, rhs.astype(lhs.dtype), group_sizes, preferred_element_type=lhs.dtype, tiling=tiling,
               interpret=interpret)
