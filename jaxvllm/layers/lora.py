"""LoRA on the engine's named linears, batched: every token runs with its own adapter
(vLLM's punica `add_shrink` / `add_expand`).

The adapters of a step sit in fixed-shape stacks, per adapted projection and layer, and
every token carries its slot (-1: no adapter); loading another adapter changes values, never
shapes. Two forms, by what the backend's float linear method can do:
- dense: A [in, parts * slots * rank] and, per part of a fused projection, B [slots * rank,
  *out of the part]. The shrink x @ A runs for every slot at once, a one-hot of the token's
  slot keeps its own part, and each expand contracts slots and rank together: plain matmuls
  with nothing data-dependent (XLA on TPU and GPU).
- grouped (a method with a grouped matmul: the CPU's packed kernel): A and B stored per
  (layer, slot); the step's tokens are sorted by slot once, and each layer multiplies every
  token by its own slot's A and B only: a slot's rank of work per token, not all slots'.
Either way a fused projection's parts (q/k/v, gate/up) expand separately, each into its slice
of the out axis that keeps them apart: no product is spent on another part's zeros.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class LoRALayout:
    """How one adapted projection runs: `a_method` / `b_method` (linear methods, layers/
    linear.py) for the shrink and the expands; `part_shapes`: each part's out shape, the parts
    joined along out axis `axis` (one part: the projection's out shape); `rank`: a slot's rank
    per part. `grouped`: the stacks are stored per (layer, slot), A [in, parts * rank] and B
    [rank, *out of the part] each, and every token multiplies its own slot's only, through
    the methods' grouped matmul (`apply_grouped`); else the dense form above."""
    a_method: object
    b_method: object
    axis: int
    part_shapes: tuple[tuple[int, ...], ...]
    rank: int
    grouped: bool = False

    @property
    def out_shape(self) -> tuple[int, ...]:
        a = self.axis
        return (*self.part_shapes[0][:a], sum(p[a] for p in self.part_shapes), *self.part_shapes[0][a + 1:])


@dataclasses.dataclass(frozen=True)
class TokenSlots:
    """A step's tokens by adapter slot, worked out once for every layer: `onehot` f32[T, slots]
    for the dense form (None when no layout is dense); for the grouped one the tokens sorted by slot (`order`, its
    `inverse`) and each slot's token count (`sizes` i32[slots]; no adapter sorts last)."""
    onehot: jax.Array | None
    order: jax.Array
    inverse: jax.Array
    sizes: jax.Array


class LoRALinear:
    """A Linear (layers/linear.py) plus its adapters' products for this step's tokens.
    The stacks go whole to the linear method, which reads layer `layer`'s weights where they
    lie (`apply_stacked`, `apply_grouped`): a slice of them would be a copy per layer and step."""
    __slots__ = ("base", "a", "bs", "layer", "slots", "layout")

    def __init__(self, base, a: jax.Array, bs: tuple, layer: int, slots: TokenSlots, layout: LoRALayout):
        self.base, self.a, self.bs, self.layer, self.slots = base, a, bs, layer, slots
        self.layout = layout

    @property
    def name(self) -> str:
        return self.base.name

    def __call__(self, x: jax.Array, num_rows: jax.Array | None = None) -> jax.Array:
        y, lay = self.base(x, num_rows), self.layout
        T = x.shape[0]
        deltas = self._grouped(x) if lay.grouped else self._dense(x, num_rows)
        # Each part's delta is added into its slice of the output (a concatenation first
        # would cost one more pass over it).
        y = y.reshape(T, *lay.out_shape)
        start = 0
        for delta, shape in zip(deltas, lay.part_shapes):
            where = (slice(None),) * (1 + lay.axis) + (slice(start, start + shape[lay.axis]),)
            y = y.at[where].add(delta.reshape(T, *shape).astype(y.dtype))
            start += shape[lay.axis]
        return y

    def _dense(self, x: jax.Array, num_rows):
        """Every slot's shrink at once, the token's own kept by its one-hot row."""
        lay, onehot = self.layout, self.slots.onehot
        T, slots, parts = x.shape[0], onehot.shape[1], len(self.bs)
        shrunk = lay.a_method.apply_stacked(x, self.a, self.layer, num_rows).reshape(T, parts, slots, -1)
        shrunk = shrunk * onehot[:, None, :, None]
        return [lay.b_method.apply_stacked(shrunk[:, j].reshape(T, -1), b, self.layer, num_rows)
                for j, b in enumerate(self.bs)]

    def _grouped(self, x: jax.Array):
        """The tokens sorted by slot, each group times its slot's A and B of this layer (the
        stacks' groups are (layer, slot) pairs: the other layers' groups are empty)."""
        lay, t = self.layout, self.slots
        S, R = t.sizes.shape[0], lay.rank
        sizes = jnp.zeros((self.a.shape[0],), jnp.int32).at[self.layer * S:(self.layer + 1) * S].set(t.sizes)
        shrunk = lay.a_method.apply_grouped(x.reshape(x.shape[0], -1)[t.order], self.a, sizes)
        return [lay.b_method.apply_grouped(shrunk[:, j * R:(j + 1) * R], b, sizes)[t.inverse]
                for j, b in enumerate(self.bs)]


def with_lora(layer_loop, layouts: dict, num_slots: int, stacks: dict, token_slots: jax.Array):
    """The backend's layer loop (models/layer_loops.py) with each adapted linear of layer i
    wrapped: stacks maps a layer leaf ('qkv_proj') to (A, (B per part)), each stacked over
    the layers in the form its layout says; layouts maps it to its LoRALayout;
    token_slots: i32[tokens], each token's slot (-1: none)."""
    slot = jnp.where(token_slots < 0, num_slots, token_slots)
    order = jnp.argsort(slot, stable=True)
    dense = any(not layout.grouped for layout in layouts.values())
    onehot = jax.nn.one_hot(token_slots, num_slots, dtype=jnp.float32) if dense else None  # -1: zeros
    slots = TokenSlots(onehot=onehot, order=order, inverse=jnp.argsort(order),
                       sizes=jnp.bincount(slot, length=num_slots + 1)[:num_slots].astype(jnp.int32))

    def adapted(i, layer):
        if not isinstance(layer, dict):  # (its number, its weights): Gemma's layers
            return tuple(adapted(i, part) if isinstance(part, dict) else part for part in layer)
        return {leaf: LoRALinear(value, *stacks[leaf], i, slots, layouts[leaf]) if leaf in stacks else value
                for leaf, value in layer.items()}

    def loop(weights, qkv, attend, mlp, h, kv_cache):
        return layer_loop([adapted(i, layer) for i, layer in enumerate(weights)], qkv, attend, mlp, h, kv_cache)

    loop.__name__ = layer_loop.__name__
    return loop
