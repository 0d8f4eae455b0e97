"""The CPU's packed linear and MoE methods (the interfaces of layers/linear.py and
layers/fused_moe.py) over the native kernels of jaxvllm/kernels/cpu/packed_matmul.py: each
weight packed once at load into panels that a call streams in order."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from jaxvllm.kernels.cpu.packed_matmul import (
    PANEL,
    grouped_packed_matmul,
    pack_experts,
    pack_weight,
    packed_matmul,
    supports,
)
from jaxvllm.layers.fused_moe import UnquantizedFusedMoEMethod


class PackedLinearMethod:
    """The model's matmuls through the native kernel: every weight [in, *out] is stored
    packed, its out axes flattened, from construction on; the output comes back as
    [..., prod(out)] for the caller to reshape."""
    # The packed head is a copy of a tied embedding (vocab x hidden floats more, for a
    # faster head at every step).
    copies_tied_head = True

    def weight_shape(self, in_features: int, out_shape: tuple[int, ...]) -> tuple[int, ...]:
        return (math.prod(out_shape) // PANEL, in_features, PANEL)

    def supports(self, in_features: int, out_shape: tuple[int, ...], dtype) -> bool:
        return supports(in_features, math.prod(out_shape), dtype)

    def process_weights_after_loading(self, w: jax.Array) -> jax.Array:
        return pack_weight(w.reshape(w.shape[0], -1))

    def stored_form(self, w: jax.ShapeDtypeStruct):
        return jax.eval_shape(self.process_weights_after_loading, w)

    def apply(self, x: jax.Array, w: jax.Array, num_rows: jax.Array | None = None) -> jax.Array:
        return packed_matmul(x, w, num_rows)

    def apply_grouped(self, x: jax.Array, stack: jax.Array, group_sizes: jax.Array) -> jax.Array:
        """x [m, in], its rows in consecutive groups, group g times stack[g] (weights stored
        by this method, stacked): [m, out], rows past the last group zeros."""
        return grouped_packed_matmul(x, stack, group_sizes).astype(x.dtype)

    def apply_stacked(self, x: jax.Array, stack: jax.Array, index: int, num_rows: jax.Array | None = None):
        """x @ stack[index] with the weight read where it lies in the stack: the grouped kernel
        with every row in group `index` (a slice of the stack as an operand is a copy)."""
        rows = x.reshape(-1, x.shape[-1])
        n = rows.shape[0] if num_rows is None else num_rows
        sizes = jnp.zeros((stack.shape[0],), jnp.int32).at[index].set(n)
        y = grouped_packed_matmul(rows, stack, sizes)
        return y.reshape(*x.shape[:-1], y.shape[-1]).astype(x.dtype)


class PackedFusedMoEMethod(UnquantizedFusedMoEMethod):
    """Float32 experts packed per expert at load and multiplied by the grouped native kernel.
    A stack whose output width is not a multiple of PANEL (or not float32) stays as declared
    and goes through the fallback grouped matmul."""

    def weight_shape(self, shape: tuple[int, ...], dtype) -> tuple[int, ...]:
        E, k, out = shape[0], shape[1], math.prod(shape[2:])
        if jnp.dtype(dtype) != jnp.float32 or out % PANEL:
            return shape
        return (E, out // PANEL, k, PANEL)

    def process_weights_after_loading(self, w: jax.Array) -> jax.Array:
        if self.weight_shape(w.shape, w.dtype) == w.shape:
            return w
        return pack_experts(w)

    def expert_matmul(self, lhs: jax.Array, w: jax.Array, group_sizes: jax.Array, experts: jax.Array) -> jax.Array:
        if w.ndim == 4 and w.shape[2:] == (lhs.shape[1], PANEL):
            return grouped_packed_matmul(lhs, w, group_sizes)
        return super().expert_matmul(lhs, w, group_sizes, experts)
