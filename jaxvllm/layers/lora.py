"""LoRA on the engine's named linears, batched: every token runs with its own adapter
(vLLM's punica `add_shrink` / `add_expand`, as XLA ops).

The adapters of a step sit in fixed-shape stacks, one pair per adapted projection and layer:
A [in, slots, rank] and B [slots, rank, *out], slot 0 holding zeros (no adapter); every token
carries its slot. The shrink x @ A runs for every slot at once (one matmul: the slots' ranks
together are narrow), a one-hot of the token's slot keeps its own part, and the expand
contracts slots and rank together: per token, x @ A[slot] @ B[slot], in two plain matmuls
with no gather of weights and nothing data-dependent in the program, so that loading another
adapter changes values, never shapes. A fused projection (qkv, gate/up) stacks its parts' ranks side by side
in A and block-diagonally in B (jaxvllm/worker/lora_manager.py), so it stays one product.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


class LoRALinear:
    """A Linear (layers/linear.py) plus its adapters' products for this step's tokens.
    The layer's slice of the stacks is taken where the product runs (inside a switched
    layer loop's branch, the whole stacks are its operand, never a copy per layer)."""
    __slots__ = ("base", "a", "b", "layer", "token_onehot")

    def __init__(self, base, a: jax.Array, b: jax.Array, layer: int, token_onehot: jax.Array):
        self.base, self.a, self.b, self.layer, self.token_onehot = base, a, b, layer, token_onehot

    @property
    def name(self) -> str:
        return self.base.name

    def __call__(self, x: jax.Array, num_rows: jax.Array | None = None) -> jax.Array:
        y = self.base(x, num_rows)
        a, b = self.a[self.layer], self.b[self.layer]
        T, (_, slots, rank) = x.shape[0], a.shape
        shrunk = (x @ a.reshape(a.shape[0], -1)).reshape(T, slots, rank) * self.token_onehot[:, :, None]
        delta = shrunk.reshape(T, -1) @ b.reshape(slots * rank, -1)
        return y + delta.reshape(y.shape).astype(y.dtype)


def with_lora(layer_loop, stacks: dict, token_slots: jax.Array):
    """The platform's layer loop (models/layer_loops.py) with each adapted linear of layer i
    wrapped: stacks maps a layer leaf ('qkv_proj') to (A [layers, in, slots, rank],
    B [layers, slots, rank, *out]); token_slots: i32[tokens], each token's slot."""
    num_slots = next(iter(stacks.values()))[1].shape[1]
    dtype = next(iter(stacks.values()))[0].dtype
    onehot = jax.nn.one_hot(token_slots, num_slots, dtype=dtype)

    def loop(weights, qkv, attend, mlp, h, kv_cache):
        weights = [{leaf: LoRALinear(value, *stacks[leaf], i, onehot)
                    if leaf in stacks else value for leaf, value in layer.items()}
                   for i, layer in enumerate(weights)]
        return layer_loop(weights, qkv, attend, mlp, h, kv_cache)

    loop.__name__ = layer_loop.__name__
    return loop
