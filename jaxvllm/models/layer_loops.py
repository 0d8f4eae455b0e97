"""How a model runs its decoder layers; the backend picks one (jaxvllm/backends).

A decoder layer is given in three parts around its attention: `qkv(w, h) -> (q, k, v)`,
`attend(q, k, v, kv_cache, layer) -> (o, kv_cache)` and `mlp(w, h, o) -> h`, where `w` is the
layer's weights. Both loops compute the same thing and differ only in the program XLA sees.
`layer` is an int under the unrolled loop and traced under the switched one; whatever differs
by layer inside `attend` (a sliding window) is a value indexed by it, never a branch: a
conditional that takes the KV cache and returns it updated makes XLA copy the whole cache.
"""
from __future__ import annotations

import functools

import jax


def unrolled_layers(weights: list, qkv, attend, mlp, h: jax.Array, kv_cache: jax.Array):
    """A Python loop: every layer is its own code with a static index into the KV cache, and
    the step has no loop or conditional for XLA to wait on or schedule around."""
    for i, w in enumerate(weights):
        o, kv_cache = attend(*qkv(w, h), kv_cache, i)
        h = mlp(w, h, o)
    return h, kv_cache


def switched_layers(weights: list, qkv, attend, mlp, h: jax.Array, kv_cache: jax.Array):
    """One `fori_loop` whose body picks the layer's projections with `lax.switch`: the
    attention is compiled once, and each matmul reads its layer's weights where they lie."""
    qkvs = [functools.partial(qkv, w) for w in weights]
    mlps = [functools.partial(mlp, w) for w in weights]

    def layer(i, carry):
        h, kv_cache = carry
        o, kv_cache = attend(*jax.lax.switch(i, qkvs, h), kv_cache, i)
        return jax.lax.switch(i, mlps, h, o), kv_cache

    return jax.lax.fori_loop(0, len(weights), layer, (h, kv_cache))


def capturing_layers(layer_loop, layer_ids: tuple[int, ...], captured: list):
    """layer_loop, also appending to `captured` the hidden states entering each of layer_ids
    (ascending; an EAGLE-3 draft reads three of the target's): the loop runs over the
    layers in segments between them, each layer keeping its own index into the KV cache."""
    def loop(weights: list, qkv, attend, mlp, h: jax.Array, kv_cache: jax.Array):
        start = 0
        for end in [*sorted(layer_ids), None]:
            stop = len(weights) if end is None else end
            if stop > start:
                h, kv_cache = layer_loop(weights[start:stop], qkv, functools.partial(_offset, attend, start),
                                         mlp, h, kv_cache)
            if end is not None:
                captured.append(h)
            start = stop
        return h, kv_cache
    return loop


def _offset(attend, start: int, q, k, v, kv_cache, layer):
    return attend(q, k, v, kv_cache, layer + start)
