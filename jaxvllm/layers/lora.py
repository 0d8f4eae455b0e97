"""LoRA on the engine's named linears, batched: every token runs with its own adapter
(vLLM's punica `add_shrink` / `add_expand`).

The adapters of a step sit in fixed-shape stacks, per adapted projection and layer: A
[in, parts * slots * rank] and, per part of a fused projection, B [slots * rank, *out of the
part]; every token carries its slot (-1: no adapter). The shrink x @ A runs for every slot at
once (one matmul: the slots' ranks together are narrow), a one-hot of the token's slot keeps
its own part, and each expand contracts slots and rank together: per token, x @ A[slot] @
B[slot], in plain matmuls with no gather of weights and nothing data-dependent in the program,
so that loading another adapter changes values, never shapes. The products run through the
platform's float linear method (the CPU's packed kernel: XLA's CPU matmul repacks its weight
on every call), and a fused projection's parts (q/k/v, gate/up) expand separately, each into
its slice of the out axis that keeps them apart: no product is spent on another part's zeros.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class LoRALayout:
    """How one adapted projection runs: `a_method` / `b_method` (linear methods, layers/
    linear.py) for the shrink and the expands; `part_shapes`: each part's out shape, the parts
    joined along out axis `axis` (one part: the projection's out shape)."""
    a_method: object
    b_method: object
    axis: int
    part_shapes: tuple[tuple[int, ...], ...]

    @property
    def out_shape(self) -> tuple[int, ...]:
        a = self.axis
        return (*self.part_shapes[0][:a], sum(p[a] for p in self.part_shapes), *self.part_shapes[0][a + 1:])


class LoRALinear:
    """A Linear (layers/linear.py) plus its adapters' products for this step's tokens.
    The stacks go whole to the linear method, which reads layer `layer`'s weights where they
    lie (`apply_stacked`): a slice of them would be a copy per layer and step."""
    __slots__ = ("base", "a", "bs", "layer", "token_onehot", "layout")

    def __init__(self, base, a: jax.Array, bs: tuple, layer: int, token_onehot: jax.Array, layout: LoRALayout):
        self.base, self.a, self.bs, self.layer, self.token_onehot = base, a, bs, layer, token_onehot
        self.layout = layout

    @property
    def name(self) -> str:
        return self.base.name

    def __call__(self, x: jax.Array, num_rows: jax.Array | None = None) -> jax.Array:
        y, lay = self.base(x, num_rows), self.layout
        T, slots, parts = x.shape[0], self.token_onehot.shape[1], len(self.bs)
        shrunk = lay.a_method.apply_stacked(x, self.a, self.layer, num_rows).reshape(T, parts, slots, -1)
        shrunk = shrunk * self.token_onehot[:, None, :, None]
        # Each part's delta is added into its slice of the output (a concatenation first
        # would cost one more pass over it).
        y = y.reshape(T, *lay.out_shape)
        start = 0
        for j, (b, shape) in enumerate(zip(self.bs, lay.part_shapes)):
            delta = lay.b_method.apply_stacked(shrunk[:, j].reshape(T, -1), b, self.layer, num_rows)
            where = (slice(None),) * (1 + lay.axis) + (slice(start, start + shape[lay.axis]),)
            y = y.at[where].add(delta.reshape(T, *shape).astype(y.dtype))
            start += shape[lay.axis]
        return y


def with_lora(layer_loop, layouts: dict, num_slots: int, stacks: dict, token_slots: jax.Array):
    """The platform's layer loop (models/layer_loops.py) with each adapted linear of layer i
    wrapped: stacks maps a layer leaf ('qkv_proj') to (A, (B per part)), each stacked over
    the layers in its linear method's stored form; layouts maps it to its LoRALayout;
    token_slots: i32[tokens], each token's slot (-1: none)."""
    onehot = jax.nn.one_hot(token_slots, num_slots, dtype=jnp.float32)  # -1: a row of zeros

    def loop(weights, qkv, attend, mlp, h, kv_cache):
        weights = [{leaf: LoRALinear(value, *stacks[leaf], i, onehot, layouts[leaf])
                    if leaf in stacks else value for leaf, value in layer.items()}
                   for i, layer in enumerate(weights)]
        return layer_loop(weights, qkv, attend, mlp, h, kv_cache)

    loop.__name__ = layer_loop.__name__
    return loop
