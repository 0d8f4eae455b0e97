"""The model's matmuls. A weight is [in, out], or, where the native CPU kernels run on one
device, packed at load into the panels of jaxvllm/kernels/cpu/packed_matmul.py."""
from __future__ import annotations

import jax

from jaxvllm.kernels.cpu.packed_matmul import can_pack, pack_weight, packed_matmul


def linear(x: jax.Array, w: jax.Array, num_rows: jax.Array | None = None) -> jax.Array:
    """x @ w. num_rows: how many leading rows of x are real (the rest is bucket padding);
    the native kernel multiplies only those and returns zeros for the others (XLA computes all)."""
    return packed_matmul(x, w, num_rows) if w.ndim == 3 else x @ w


def maybe_pack(w: jax.Array) -> jax.Array | None:
    """The packed weight, or None where the kernel cannot take it (it stays [in, out], on XLA)."""
    return pack_weight(w) if can_pack(w) else None


def pack_linear_weights(layers, names: tuple[str, ...], fused: dict[str, tuple[str, ...]]) -> int:
    """Pack the named weights of each layer (nnx.Dict) that the kernel can take, and replace
    each group of `fused` (weights that multiply the same input: {fused name: parts}) by one
    packed weight of their columns side by side, so that one call reads the input once and
    streams all of them. Returns how many packed weights the layers hold."""
    packed = 0
    for layer in layers:
        for name, parts in fused.items():
            weights = [layer[part].get_value() for part in parts]
            if all(can_pack(w) for w in weights):
                layer[name] = layer[parts[0]].replace(pack_weight(*weights))
                for part in parts:
                    del layer[part]
                packed += 1
        for name in names:
            if name in layer and (p := maybe_pack(layer[name].get_value())) is not None:
                layer[name].set_value(p)
                packed += 1
    return packed
