"""A grouped matmul in jax.numpy that computes only the (row tile, group) pairs that hold
rows: the mixture-of-experts layer's on the CPU.

Same contract as `jax.lax.ragged_dot(lhs [m, k], rhs [groups, k, n], group_sizes)`. XLA:CPU
lowers ragged_dot to a batched product of every row with every group's matrix, masked: the
work of the dense layer, through XLA:CPU's slow batched-matmul path. Here a loop visits each
tile of `tile` rows once per group it overlaps (megablox's schedule, pallas_kernels/
grouped_matmul_tpu.py), so a step reads each used expert's weights about once per tile and
multiplies about m rows in all; its trip count is a traced value (a while loop).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

TILE = 64


def grouped_matmul(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array, *, tile: int = TILE) -> jax.Array:
    m, k = lhs.shape
    n = rhs.shape[2]
    tm = min(tile, m)
    pad = -m % tm
    lhs = jnp.pad(lhs, ((0, pad), (0, 0)))
    ends = jnp.cumsum(group_sizes)
    starts = ends - group_sizes
    # Each non-empty group's tiles: from the one holding its first row to the one holding its last.
    first_tile = starts // tm
    num_tiles = jnp.where(group_sizes > 0, (ends - 1) // tm - first_tile + 1, 0)
    items_end = jnp.cumsum(num_tiles)  # work items [items_end[g] - num_tiles[g], items_end[g]) are group g's

    def item(i, out):
        g = jnp.searchsorted(items_end, i, side="right")
        row = (first_tile[g] + i - (items_end[g] - num_tiles[g])) * tm
        # An 8-bit rhs (quantized experts) is converted one group's matrix at a time.
        w = jax.lax.dynamic_index_in_dim(rhs, g, keepdims=False).astype(lhs.dtype)
        product = jax.lax.dynamic_slice_in_dim(lhs, row, tm) @ w
        rows = row + jnp.arange(tm)
        mine = (rows >= starts[g]) & (rows < ends[g])
        kept = jax.lax.dynamic_slice_in_dim(out, row, tm)
        return jax.lax.dynamic_update_slice_in_dim(out, jnp.where(mine[:, None], product.astype(out.dtype), kept),
                                                   row, 0)

    out = jax.lax.fori_loop(0, items_end[-1], item, jnp.zeros((m + pad, n), lhs.dtype))
    return out[:m]
