"""x @ w on the CPU through the native kernel (packed_matmul.cc), w packed once at load.

`pack_weight` turns an [in, out] weight into panels of PANEL columns, [out/PANEL, in, PANEL],
so that each call streams the weight from memory once, in order (XLA's CPU matmul repacks
its right-hand operand on every call, which costs more than a decode step's product). A
bfloat16 weight keeps that shape with each panel's rows in pairs (the operand of AVX-512's
bfloat16 dot product); x is multiplied in bfloat16, accumulated in float32.
`pack_experts` packs a mixture-of-experts layer's experts the same way, each read in place by
`grouped_packed_matmul`. A model calls them through jaxvllm/layers/packed_linear.py.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxvllm.kernels.cpu import build

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
