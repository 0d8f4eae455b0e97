"""The model's matmuls. A weight is [in, out], or, where the native CPU kernels run on one
device, packed at load into the panels of jaxvllm/native/packed_matmul.py."""
from __future__ import annotations

import jax

from jaxvllm.native.packed_matmul import can_pack, pack_weight, packed_matmul


def linear(x: jax.Array, w: jax.Array) -> jax.Array:
    return packed_matmul(x, w) if w.ndim == 3 else x @ w


def maybe_pack(w: jax.Array) -> jax.Array | None:
    """The packed weight, or None where the kernel cannot take it (it stays [in, out], on XLA)."""
    return pack_weight(w) if can_pack(w) else None


def pack_linear_weights(layers, names: tuple[str, ...]) -> int:
    """Pack the named weights of each layer (nnx.Dict) that the kernel can take; returns how
    many it packed."""
    packed = 0
    for layer in layers:
        for name in names:
            if (p := maybe_pack(layer[name].get_value())) is not None:
                layer[name].set_value(p)
                packed += 1
    return packed
