"""x @ w on the CPU through the native kernel (packed_matmul.cc), w packed once at load.

`pack_weight` turns an [in, out] weight into panels of PANEL columns, [out/PANEL, in, PANEL],
so that each call streams the weight from memory once, in order (XLA's CPU matmul repacks
its right-hand operand on every call, which costs more than a decode step's product). A
bfloat16 weight keeps that shape with each panel's rows in pairs (the operand of AVX-512's
bfloat16 dot product); x is multiplied in bfloat16, accumulated in float32.
`PackedLinearMethod` is how a model uses it (the interface of jaxvllm/layers/linear.py);
`PackedFusedMoEMethod` packs a mixture-of-experts layer's experts the same way, each read in
place by the grouped kernel.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from jaxvllm.kernels.cpu import build
from jaxvllm.layers.fused_moe import UnquantizedFusedMoEMethod

PANEL = 32  # columns per panel: kPanel in packed_matmul.cc


TARGETS = {jnp.dtype(jnp.float32): ("jaxvllm_packed_matmul", "jaxvllm_grouped_packed_matmul"),
           jnp.dtype(jnp.bfloat16): ("jaxvllm_packed_matmul_bf16", "jaxvllm_grouped_packed_matmul_bf16")}


def supports(in_features: int, out_features: int, dtype) -> bool:
    """float32 or bfloat16 (an even number of rows: they are packed in pairs); out a multiple of PANEL."""
    dtype = jnp.dtype(dtype)
    return dtype in TARGETS and out_features % PANEL == 0 and (dtype == jnp.float32 or in_features % 2 == 0)


def can_pack(w) -> bool:
    return w.ndim == 2 and supports(w.shape[0], w.shape[1], w.dtype)


def pack_weight(*ws) -> jax.Array:
    """[in, out] with out a multiple of PANEL -> [out/PANEL, in, PANEL]. Given several
    weights of the same input, packs their columns side by side: one weight for one call."""
    for w in ws:
        if not can_pack(w):
            raise ValueError(f"pack_weight needs a float32 or bfloat16 [in, out] weight with out a multiple of "
                             f"{PANEL} (and in even for bfloat16), got {w.dtype}{list(w.shape)}.")
    return _panels(tuple(jnp.asarray(w) for w in ws))


@jax.jit
def _panels(ws: tuple[jax.Array, ...]) -> jax.Array:
    # Jitted: XLA's concatenation and transpose run as one pass, on every core (numpy's
    # transpose took ~3x as long at start-up).
    return _panel_layout(jnp.concatenate(ws, axis=1))


def _panel_layout(w: jax.Array) -> jax.Array:
    k, n = w.shape
    if w.dtype == jnp.float32:
        return w.reshape(k, n // PANEL, PANEL).transpose(1, 0, 2)
    # bfloat16: [s, k/2, j, k%2], the same shape as float32's panels
    return w.reshape(k // 2, 2, n // PANEL, PANEL).transpose(2, 0, 3, 1).reshape(n // PANEL, k, PANEL)


def packed_matmul(x: jax.Array, packed: jax.Array, num_rows: jax.Array | None = None) -> jax.Array:
    """x [..., in] @ the packed weight -> [..., out], in x's dtype (accumulated in float32,
    x multiplied in the weight's dtype). With num_rows (an int32 scalar), only x's first
    num_rows rows (flattened) are multiplied; the rest of y is zeros: a padded step pays for
    its real tokens only."""
    build.load()
    rows = x.reshape(-1, x.shape[-1]).astype(packed.dtype)
    n = jnp.full((1,), rows.shape[0] if num_rows is None else num_rows, jnp.int32)
    out = packed.shape[0] * PANEL
    y = jax.ffi.ffi_call(TARGETS[packed.dtype][0], jax.ShapeDtypeStruct((rows.shape[0], out), jnp.float32))(
        rows, packed, n)
    return y.reshape(*x.shape[:-1], out).astype(x.dtype)


@jax.jit
def pack_experts(w: jax.Array) -> jax.Array:
    """[experts, in, *out], prod(out) a multiple of PANEL -> [experts, out/PANEL, in, PANEL]."""
    return jax.vmap(_panel_layout)(w.reshape(*w.shape[:2], -1))


def grouped_packed_matmul(lhs: jax.Array, packed: jax.Array, group_sizes: jax.Array) -> jax.Array:
    """lhs [m, in], its rows in consecutive groups, group e times expert e's packed weight
    (packed: [experts, out/PANEL, in, PANEL]) -> [m, out] float32; rows past the last group
    are zeros (the contract of layers/fused_moe.GroupedMatmul)."""
    build.load()
    out = packed.shape[1] * PANEL
    return jax.ffi.ffi_call(TARGETS[packed.dtype][1], jax.ShapeDtypeStruct((lhs.shape[0], out), jnp.float32))(
        lhs.astype(packed.dtype), packed, group_sizes.astype(jnp.int32))


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
