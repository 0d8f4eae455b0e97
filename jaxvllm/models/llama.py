"""Llama-family decoder (Llama 2/3, SmolLM2, Mistral, Qwen2-style QKV bias) in Flax NNX.

Each decoder layer keeps its own weight arrays, and a layer is two pure functions around its
attention (`attention_inputs`, `mlp_block`); the caller's `layer_loop` (the backend's choice,
models/layer_loops.py) runs them over the layers. The paged KV cache is carried through the
loop and updated in place. `attention_weights` and `mlp_weights` declare the layer's weights
(q/k/v and gate/up fused at load, as nano-vLLM's packed_modules_mapping); the families built
on Llama's attention reuse them.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxvllm.distributed.logical_axes import EMBED, HEADS, KV_HEADS, MLP, SEQUENCE, VOCAB, constrain
from jaxvllm.layers.attention import AttentionMetadata
from jaxvllm.layers.layernorm import rms_norm
from jaxvllm.layers.rotary import apply_rotary, compute_inv_freq, rotary_cos_sin
from jaxvllm.models.causal_lm import CausalLM
from jaxvllm.models.weight_spec import Weight, linear, vector


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
    sliding_layers: tuple[bool, ...] = ()  # per layer: attends over sliding_window only (empty: all)

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

    def for_layers(self, layers: range) -> "LlamaArgs":
        """The args of a model of only these decoder layers (a pipeline stage's)."""
        return dataclasses.replace(self, num_layers=len(layers),
                                   sliding_layers=self.sliding_layers[layers.start:layers.stop])


def sliding_windows(a: LlamaArgs) -> int | jax.Array | None:
    """The layers' sliding windows as the kernels take them: one value when all layers agree,
    else i32[layers] (0: global) that the layer loop indexes by layer, so that one attention
    serves sliding and global layers alike."""
    if not a.sliding_layers:
        return a.sliding_window
    windows = [a.sliding_window if s else 0 for s in a.sliding_layers]
    if len(set(windows)) == 1:
        return windows[0] or None
    return jnp.asarray(windows, jnp.int32)


def attention_inputs(a: LlamaArgs, w: dict, h: jax.Array, *, cos_sin: tuple[jax.Array, jax.Array],
                     num_tokens: jax.Array):
    """A layer's q, k, v [tokens, heads, head_dim] from the hidden states h, rotated: one
    matmul, whose out axes are the KV heads, each with its group of query heads, its K and
    its V (so that a tensor-parallel shard of KV heads holds whole groups).
    cos_sin: the step's `rotary_cos_sin`; num_tokens: the real rows of h (the rest is bucket
    padding)."""
    T, group = h.shape[0], a.num_heads // a.num_kv_heads
    x = rms_norm(h, w["input_layernorm"], a.rms_norm_eps)
    qkv = w["qkv_proj"](x, num_tokens).reshape(T, a.num_kv_heads, group + 2, a.head_dim)
    if a.attention_bias:
        qkv = qkv + w["qkv_bias"]
    # Heads stay on their tensor-parallel shard from projection to attention output.
    qkv = constrain(qkv, SEQUENCE, KV_HEADS, None, None)
    q = constrain(qkv[:, :, :group].reshape(T, a.num_heads, a.head_dim), SEQUENCE, HEADS, None)
    k, v = qkv[:, :, group], qkv[:, :, group + 1]
    return apply_rotary(q, cos_sin), apply_rotary(k, cos_sin), v


def dense_mlp(a: LlamaArgs, w: dict, x: jax.Array, num_tokens: jax.Array) -> jax.Array:
    """SwiGLU: gate and up in one matmul, then down."""
    gate_up = w["gate_up_proj"](x, num_tokens).reshape(x.shape[0], 2, a.intermediate_size)
    return w["down_proj"](constrain(jax.nn.silu(gate_up[:, 0]) * gate_up[:, 1], SEQUENCE, MLP), num_tokens)


def mlp_block(a: LlamaArgs, w: dict, h: jax.Array, o: jax.Array, *, num_tokens: jax.Array) -> jax.Array:
    """The rest of a layer after attention: output projection, residual, MLP, residual."""
    T = h.shape[0]
    # All-reduced over the tensor-parallel shards: replicated.
    h = constrain(h + w["o_proj"](o.reshape(T, -1), num_tokens), SEQUENCE, EMBED)
    x = rms_norm(h, w["post_attention_layernorm"], a.rms_norm_eps)
    return constrain(h + dense_mlp(a, w, x, num_tokens), SEQUENCE, EMBED)


def split_heads(key: str, w, n: int, head_dim: int):
    """[n * head_dim * kv heads, ...] -> [kv heads, n, head_dim, ...] (KV heads may be few)."""
    if w.shape[0] % (n * head_dim):
        raise ValueError(f"Tensor {key!r} of shape {w.shape} does not fit the model config "
                         f"({n} heads of {head_dim} per KV head).")
    return w.reshape(-1, n, head_dim, *w.shape[1:])


def fuse_qkv(a: LlamaArgs, key: str, q, k, v):
    """q/k/v ([out, in] weights or [out] biases) as one [kv heads, group + 2, head_dim(, in)]:
    each KV head with its group of query heads, its K and its V."""
    group, d = a.num_heads // a.num_kv_heads, a.head_dim
    if q.shape[0] != k.shape[0] // d * group * d:
        raise ValueError(f"Tensor {key!r}: {q.shape[0] // d} query heads for {k.shape[0] // d} KV "
                         f"heads do not fit the model config (groups of {group}).")
    return np.concatenate([split_heads(key, q, group, d), split_heads(key, k, 1, d),
                           split_heads(key, v, 1, d)], axis=1)


def fuse_qkv_weight(a: LlamaArgs, key: str, q, k, v):
    """fuse_qkv's [kv heads, group + 2, head_dim, in] as the linear's [in, kv heads, group + 2, head_dim]."""
    return fuse_qkv(a, key, q, k, v).transpose(3, 0, 1, 2)


def attention_weights(a: LlamaArgs, prefix: str = "model.layers.{i}.") -> list[Weight]:
    """Llama's attention: the fused q/k/v projection (and bias), o_proj, the input norm."""
    group, d = a.num_heads // a.num_kv_heads, a.head_dim
    attn = prefix + "self_attn."
    qkv = (a.num_kv_heads, group + 2, d)
    weights = [
        vector("layers.{i}.input_layernorm", a.hidden_size, prefix + "input_layernorm.weight", init=1.0),
        linear("layers.{i}.qkv_proj", a.hidden_size, qkv, (EMBED, KV_HEADS, None, None),
               [f"{attn}{n}_proj.weight" for n in "qkv"], functools.partial(fuse_qkv_weight, a),
               name=attn + "qkv_proj.weight"),
        linear("layers.{i}.o_proj", a.num_heads * d, (a.hidden_size,), (HEADS, EMBED), [attn + "o_proj.weight"]),
    ]
    if a.attention_bias:
        weights.append(Weight("layers.{i}.qkv_bias", qkv, (KV_HEADS, None, None),
                              tuple(f"{attn}{n}_proj.bias" for n in "qkv"), functools.partial(fuse_qkv, a),
                              name=attn + "qkv_proj.bias"))
    return weights


def mlp_weights(a: LlamaArgs, prefix: str = "model.layers.{i}.mlp.") -> list[Weight]:
    """SwiGLU's gate/up (fused: one matmul reads x once) and down projections."""
    return [
        linear("layers.{i}.gate_up_proj", a.hidden_size, (2, a.intermediate_size), (EMBED, None, MLP),
               [prefix + "gate_proj.weight", prefix + "up_proj.weight"], stack_gate_up,
               name=prefix + "gate_up_proj.weight"),
        linear("layers.{i}.down_proj", a.intermediate_size, (a.hidden_size,), (MLP, EMBED),
               [prefix + "down_proj.weight"]),
    ]


def stack_gate_up(key: str, gate, up):
    return np.stack([gate.T, up.T], axis=1)


def model_weights(a: LlamaArgs) -> list[Weight]:
    """Outside the layers: the embedding (vocabulary parallel), the final norm, the head
    (the embedding itself where tied)."""
    head = (linear("lm_head", a.hidden_size, (a.vocab_size,), (EMBED, VOCAB), tied_to="embed_tokens", stage="last")
            if a.tie_word_embeddings else
            linear("lm_head", a.hidden_size, (a.vocab_size,), (EMBED, VOCAB), ["lm_head.weight"], stage="last"))
    return [Weight("embed_tokens", (a.vocab_size, a.hidden_size), (VOCAB, EMBED), ("model.embed_tokens.weight",),
                   stage="first"),
            vector("norm", a.hidden_size, "model.norm.weight", init=1.0, stage="last"), head]


def weight_spec(a: LlamaArgs) -> list[Weight]:
    return [*model_weights(a), *attention_weights(a),
            vector("layers.{i}.post_attention_layernorm", a.hidden_size,
                   "model.layers.{i}.post_attention_layernorm.weight", init=1.0),
            *mlp_weights(a)]


class LlamaForCausalLM(CausalLM):
    weight_spec = staticmethod(weight_spec)
    attention_inputs = staticmethod(attention_inputs)

    def final_norm(self, h: jax.Array) -> jax.Array:
        return rms_norm(h, self.norm.get_value(), self.args.rms_norm_eps)

    def forward_layers(self, h: jax.Array, kv_cache: jax.Array, md: AttentionMetadata, attend,
                       layer_loop) -> tuple[jax.Array, jax.Array]:
        """This model's decoder layers over hidden states h; layer i uses kv_cache[i]."""
        a = self.args
        inv_freq = jnp.asarray(compute_inv_freq(a.head_dim, a.rope_theta, dict(a.rope_scaling or ())))
        num_tokens = md.cu_q_lens[md.num_seqs[0]]  # the rest of the token axis is padding
        qkv = functools.partial(self.attention_inputs, a, cos_sin=rotary_cos_sin(md.positions, inv_freq),
                                num_tokens=num_tokens)

        windows = sliding_windows(a)

        def attend_layer(q, k, v, kv_cache, layer):
            window = windows[layer] if isinstance(windows, jax.Array) else windows
            return attend(q, k, v, kv_cache, layer, md, a.head_dim ** -0.5, window)

        return layer_loop(self.layer_weights(), qkv, attend_layer, self.mlp(num_tokens), h, kv_cache)

    def mlp(self, num_tokens: jax.Array):
        """The layer function after attention: (weights, h, attention output) -> h."""
        return functools.partial(mlp_block, self.args, num_tokens=num_tokens)
