"""Llama-family decoder (Llama 2/3, SmolLM2, Mistral, Qwen2-style QKV bias) in Flax NNX.

Each decoder layer keeps its own weight arrays, and a layer is two pure functions around its
attention (`attention_inputs`, `mlp_block`); the caller's `layer_loop` (the platform's choice,
models/layer_loops.py) runs them over the layers. The paged KV cache is carried through the
loop and updated in place.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxvllm.distributed.mesh import MODEL_AXIS as M, constrain
from jaxvllm.layers.attention import AttentionMetadata
from jaxvllm.layers.linear import linear, maybe_pack, pack_linear_weights
from jaxvllm.layers.rotary import apply_rotary, compute_inv_freq


@dataclasses.dataclass(frozen=True)
class LlamaArgs:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: tuple | None  # sorted (key, value) pairs: kept hashable for jit
    tie_word_embeddings: bool
    attention_bias: bool
    max_position_embeddings: int
    sliding_window: int | None = None  # Mistral v0.1: attend to the last N positions only

    @classmethod
    def from_hf_config(cls, cfg) -> "LlamaArgs":
        rope = dict(getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {})
        theta = rope.pop("rope_theta", getattr(cfg, "rope_theta", 10000.0))
        bias = getattr(cfg, "attention_bias", False) or getattr(cfg, "model_type", "") == "qwen2"
        window = getattr(cfg, "sliding_window", None)
        if getattr(cfg, "use_sliding_window", True) is False:
            window = None
        elif window is not None and getattr(cfg, "model_type", "") == "qwen2":
            raise ValueError("Qwen2 with use_sliding_window=True (per-layer windows) is not supported.")
        return cls(
            vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
            intermediate_size=cfg.intermediate_size, num_layers=cfg.num_hidden_layers,
            num_heads=cfg.num_attention_heads,
            num_kv_heads=getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads,
            head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads,
            rms_norm_eps=cfg.rms_norm_eps, rope_theta=float(theta),
            rope_scaling=(tuple(sorted(rope.items()))
                          if rope.get("rope_type", rope.get("type", "default")) != "default" else None),
            tie_word_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)),
            attention_bias=bool(bias),
            max_position_embeddings=cfg.max_position_embeddings,
            sliding_window=window,
        )


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return weight * x32.astype(x.dtype)


def attention_inputs(a: LlamaArgs, w: dict, h: jax.Array, *, positions: jax.Array,
                     inv_freq: jax.Array, num_tokens: jax.Array):
    """A layer's q, k, v [tokens, heads, head_dim] from the hidden states h, rotated.
    num_tokens: the real rows of h (the rest is bucket padding)."""
    T, q_size, kv_size = h.shape[0], a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim
    x = rms_norm(h, w["input_norm"], a.rms_norm_eps)
    if "wqkv" in w:
        q, k, v = jnp.split(linear(x, w["wqkv"], num_tokens), [q_size, q_size + kv_size], axis=-1)
    else:
        q, k, v = (linear(x, w[n], num_tokens) for n in ("wq", "wk", "wv"))
    if a.attention_bias:
        q, k, v = q + w["bq"], k + w["bk"], v + w["bv"]
    # Heads stay on their tensor-parallel shard from projection to attention output.
    q, k, v = (constrain(t.reshape(T, -1, a.head_dim), None, M, None) for t in (q, k, v))
    return apply_rotary(q, positions, inv_freq), apply_rotary(k, positions, inv_freq), v


def mlp_block(a: LlamaArgs, w: dict, h: jax.Array, o: jax.Array, *, num_tokens: jax.Array) -> jax.Array:
    """The rest of a layer after attention: output projection, residual, MLP, residual."""
    # All-reduced over the tensor-parallel shards: replicated.
    h = constrain(h + linear(o.reshape(h.shape[0], -1), w["wo"], num_tokens), None, None)
    x = rms_norm(h, w["post_attn_norm"], a.rms_norm_eps)
    if "w_gate_up" in w:
        gate, up = jnp.split(linear(x, w["w_gate_up"], num_tokens), 2, axis=-1)
    else:
        gate, up = linear(x, w["w_gate"], num_tokens), linear(x, w["w_up"], num_tokens)
    up = constrain(jax.nn.silu(gate) * up, None, M)
    return constrain(h + linear(up, w["w_down"], num_tokens), None, None)


LINEAR_WEIGHTS = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")
# Packed for the native kernel, the projections of one input become one weight each.
FUSED_WEIGHTS = {"wqkv": ("wq", "wk", "wv"), "w_gate_up": ("w_gate", "w_up")}


def _layer_shapes(a: LlamaArgs) -> dict[str, tuple[int, ...]]:
    """One decoder layer's weights, [in, out] so that activations multiply from the left."""
    q, kv = a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim
    shapes = {
        "input_norm": (a.hidden_size,), "post_attn_norm": (a.hidden_size,),
        "wq": (a.hidden_size, q), "wk": (a.hidden_size, kv), "wv": (a.hidden_size, kv),
        "wo": (q, a.hidden_size),
        "w_gate": (a.hidden_size, a.intermediate_size), "w_up": (a.hidden_size, a.intermediate_size),
        "w_down": (a.intermediate_size, a.hidden_size),
    }
    if a.attention_bias:
        shapes.update(bq=(q,), bk=(kv,), bv=(kv,))
    return shapes


class LlamaForCausalLM(nnx.Module):
    def __init__(self, args: LlamaArgs, *, dtype=jnp.float32):
        """Weights are zeros (norms ones): the model is built under nnx.eval_shape and its
        weights loaded next. (Random init traced ~10x slower, half a second of every start.)"""
        self.args = args
        self.embed_tokens = nnx.Param(jnp.zeros((args.vocab_size, args.hidden_size), dtype))
        self.layers = nnx.List([nnx.Dict({
            name: nnx.Param((jnp.ones if name.endswith("norm") else jnp.zeros)(shape, dtype))
            for name, shape in _layer_shapes(args).items()}) for _ in range(args.num_layers)])
        self.norm = nnx.Param(jnp.ones((args.hidden_size,), dtype))
        self.lm_head = None if args.tie_word_embeddings else nnx.Param(
            jnp.zeros((args.hidden_size, args.vocab_size), dtype))

    def __call__(self, input_ids: jax.Array, kv_cache: jax.Array, md: AttentionMetadata,
                 attend, layer_loop) -> tuple[jax.Array, jax.Array]:
        """One forward pass over a flat, padded token axis; returns final hidden states
        [tokens, hidden] and the updated cache. Logits are computed separately, only for
        the rows that sample."""
        a = self.args
        inv_freq = jnp.asarray(compute_inv_freq(a.head_dim, a.rope_theta, dict(a.rope_scaling or ())))
        num_tokens = md.cu_q_lens[md.num_seqs[0]]  # the rest of the token axis is padding
        qkv = functools.partial(attention_inputs, a, positions=md.positions, inv_freq=inv_freq,
                                num_tokens=num_tokens)
        mlp = functools.partial(mlp_block, a, num_tokens=num_tokens)

        def attend_layer(q, k, v, kv_cache, layer):
            return attend(q, k, v, kv_cache, layer, md, a.head_dim ** -0.5, a.sliding_window)

        weights = [{k: v.get_value() for k, v in layer.items()} for layer in self.layers]
        h = constrain(self.embed_tokens.get_value()[input_ids], None, None)
        h, kv_cache = layer_loop(weights, qkv, attend_layer, mlp, h, kv_cache)
        return rms_norm(h, self.norm.get_value(), a.rms_norm_eps), kv_cache

    def load_hf_weights(self, weights: dict[str, np.ndarray], place=None) -> None:
        """place(name, host_array) -> jax.Array puts each weight on device (default: the
        default device); the tensor-parallel worker passes one that places shard by shard."""
        _load_hf_weights(self, weights, place or (lambda name, value: jnp.asarray(value)))

    def pack_linear_weights(self) -> int:
        """Pack the decoder layers' matmul weights (q/k/v and gate/up fused) and the LM head
        for the native CPU kernel (one device only: packed weights are not sharded). A tied
        head gets a packed copy of the embedding: vocab × hidden floats more, for a faster
        head at every step."""
        packed = pack_linear_weights(self.layers, LINEAR_WEIGHTS, FUSED_WEIGHTS)
        if (head := maybe_pack(self._head())) is not None:
            self.lm_head = nnx.data(nnx.Param(head))  # was None (static) when tied
            packed += 1
        return packed

    def _head(self) -> jax.Array:
        return self.embed_tokens.get_value().T if self.lm_head is None else self.lm_head.get_value()

    def compute_logits(self, hidden: jax.Array, num_rows: jax.Array | None = None) -> jax.Array:
        """Logits of hidden's rows; with num_rows, those past it (padding) may be zeros."""
        return constrain(linear(hidden, self._head(), num_rows).astype(jnp.float32), None, M)  # vocab parallel


_HF_LAYER_NAMES = {
    "input_layernorm.weight": "input_norm", "post_attention_layernorm.weight": "post_attn_norm",
    "self_attn.q_proj.weight": "wq", "self_attn.k_proj.weight": "wk", "self_attn.v_proj.weight": "wv",
    "self_attn.o_proj.weight": "wo", "mlp.gate_proj.weight": "w_gate", "mlp.up_proj.weight": "w_up",
    "mlp.down_proj.weight": "w_down", "self_attn.q_proj.bias": "bq", "self_attn.k_proj.bias": "bk",
    "self_attn.v_proj.bias": "bv",
}


def _load_hf_weights(model: LlamaForCausalLM, weights: dict[str, np.ndarray], place) -> None:
    """Copy a Hugging Face state dict ([out, in] linear weights) into the model.

    The model's head counts may be padded for tensor parallelism (distributed.partition.
    padded_heads): checkpoint heads fill the leading slots of each head axis, zeros the rest.
    """
    a = model.args
    dtype = model.embed_tokens.get_value().dtype
    shapes = _layer_shapes(a)
    for i in range(a.num_layers):
        for hf_suffix, name in _HF_LAYER_NAMES.items():
            if name not in shapes:
                continue
            key = f"model.layers.{i}.{hf_suffix}"
            if key not in weights:
                raise ValueError(f"Checkpoint is missing tensor {key!r}.")
            w = weights[key].T if weights[key].ndim == 2 else weights[key]
            if any(n > m for n, m in zip(w.shape, shapes[name])):
                raise ValueError(f"Tensor {key!r} of shape {weights[key].shape} does not fit the "
                                 f"model config ({shapes[name]}, [in, out]).")
            if w.shape == shapes[name]:
                value = w.astype(dtype, copy=False)
            else:
                value = np.zeros(shapes[name], dtype)
                value[tuple(slice(0, n) for n in w.shape)] = w
            model.layers[i][name].set_value(place(f"layers.{i}.{name}", value))
    # copy=False: each copy of a large weight costs start-up time (page faults included).
    embed = weights["model.embed_tokens.weight"].astype(dtype, copy=False)
    model.embed_tokens.set_value(place("embed_tokens", embed))
    model.norm.set_value(place("norm", weights["model.norm.weight"].astype(dtype, copy=False)))
    if model.lm_head is not None:
        model.lm_head.set_value(place("lm_head", weights["lm_head.weight"].T.astype(dtype, copy=False)))
