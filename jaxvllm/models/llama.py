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
from jaxvllm.layers.linear import UnquantizedLinearMethod
from jaxvllm.layers.rotary import apply_rotary, compute_inv_freq, rotary_cos_sin
from jaxvllm.models import hf_weights


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

    def for_layers(self, layers: range) -> "LlamaArgs":
        """The args of a model of only these decoder layers (a pipeline stage's)."""
        return dataclasses.replace(self, num_layers=len(layers))


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return weight * x32.astype(x.dtype)


def attention_inputs(a: LlamaArgs, linear, w: dict, h: jax.Array, *, cos_sin: tuple[jax.Array, jax.Array],
                     num_tokens: jax.Array):
    """A layer's q, k, v [tokens, heads, head_dim] from the hidden states h, rotated: one
    matmul, whose out axes are the KV heads, each with its group of query heads, its K and
    its V (so that a tensor-parallel shard of KV heads holds whole groups).
    cos_sin: the step's `rotary_cos_sin`; num_tokens: the real rows of h (the rest is bucket
    padding)."""
    T, group = h.shape[0], a.num_heads // a.num_kv_heads
    x = rms_norm(h, w["input_layernorm"], a.rms_norm_eps)
    qkv = linear(x, w["qkv_proj"], num_tokens).reshape(T, a.num_kv_heads, group + 2, a.head_dim)
    if a.attention_bias:
        qkv = qkv + w["qkv_bias"]
    # Heads stay on their tensor-parallel shard from projection to attention output.
    qkv = constrain(qkv, None, M, None, None)
    q = constrain(qkv[:, :, :group].reshape(T, a.num_heads, a.head_dim), None, M, None)
    k, v = qkv[:, :, group], qkv[:, :, group + 1]
    return apply_rotary(q, cos_sin), apply_rotary(k, cos_sin), v


def mlp_block(a: LlamaArgs, linear, w: dict, h: jax.Array, o: jax.Array, *,
              num_tokens: jax.Array) -> jax.Array:
    """The rest of a layer after attention: output projection, residual, MLP (gate and up in
    one matmul), residual."""
    T = h.shape[0]
    # All-reduced over the tensor-parallel shards: replicated.
    h = constrain(h + linear(o.reshape(T, -1), w["o_proj"], num_tokens), None, None)
    x = rms_norm(h, w["post_attention_layernorm"], a.rms_norm_eps)
    gate_up = linear(x, w["gate_up_proj"], num_tokens).reshape(T, 2, a.intermediate_size)
    up = constrain(jax.nn.silu(gate_up[:, 0]) * gate_up[:, 1], None, M)
    return constrain(h + linear(up, w["down_proj"], num_tokens), None, None)


def linear_shapes(a: LlamaArgs) -> dict[str, tuple[int, tuple[int, ...]]]:
    """Each matmul weight's (in features, out shape); the layers' weights stand for every
    layer's. q/k/v and gate/up are fused (nano-vllm's packed_modules_mapping): one matmul
    reads the input once."""
    group = a.num_heads // a.num_kv_heads
    return {
        "qkv_proj": (a.hidden_size, (a.num_kv_heads, group + 2, a.head_dim)),
        "o_proj": (a.num_heads * a.head_dim, (a.hidden_size,)),
        "gate_up_proj": (a.hidden_size, (2, a.intermediate_size)),
        "down_proj": (a.intermediate_size, (a.hidden_size,)),
        "lm_head": (a.hidden_size, (a.vocab_size,)),
    }


def _layer_shapes(a: LlamaArgs, linear_method) -> dict[str, tuple[int, ...]]:
    """One decoder layer's weights, linears in the shape the linear method stores them."""
    shapes = {name: linear_method.weight_shape(i, o) for name, (i, o) in linear_shapes(a).items()
              if name != "lm_head"}
    shapes.update(input_layernorm=(a.hidden_size,), post_attention_layernorm=(a.hidden_size,))
    if a.attention_bias:
        shapes["qkv_bias"] = linear_shapes(a)["qkv_proj"][1]
    return shapes


class LlamaForCausalLM(nnx.Module):
    """A family changes its parts (embed, the layer functions in forward_layers, final_norm),
    never the forward that joins them: pipeline stages run the parts one by one."""
    linear_shapes = staticmethod(linear_shapes)
    attention_inputs = staticmethod(attention_inputs)

    def __init__(self, args: LlamaArgs, *, dtype=jnp.float32, linear_method=None):
        """Weights are zeros (norms ones): the model is built under nnx.eval_shape and its
        weights loaded next. (Random init traced ~10x slower, half a second of every start.)
        linear_method (jaxvllm/layers/linear.py; the platform's) fixes how the matmul weights
        are stored and multiplied; default XLA's."""
        self.args = args
        self.linear_method = linear_method or UnquantizedLinearMethod()
        self.embed_tokens = nnx.Param(jnp.zeros((args.vocab_size, args.hidden_size), dtype))
        self.layers = nnx.List([nnx.Dict({
            name: nnx.Param((jnp.ones if name.endswith("norm") else jnp.zeros)(shape, dtype))
            for name, shape in _layer_shapes(args, self.linear_method).items()})
            for _ in range(args.num_layers)])
        self.norm = nnx.Param(jnp.ones((args.hidden_size,), dtype))
        # A tied head is the embedding itself, unless the linear method keeps its own copy.
        own_head = not args.tie_word_embeddings or self.linear_method.copies_tied_head
        self.lm_head = nnx.Param(jnp.zeros(self.linear_method.weight_shape(*linear_shapes(args)["lm_head"]),
                                           dtype)) if own_head else None

    def __call__(self, input_ids: jax.Array, kv_cache: jax.Array, md: AttentionMetadata,
                 attend, layer_loop) -> tuple[jax.Array, jax.Array]:
        """One forward pass over a flat, padded token axis: final hidden states [tokens,
        hidden] and the updated cache (logits separately, for the rows that sample). A
        pipeline stage (worker/pipeline_runner.py) runs the parts it holds."""
        h, kv_cache = self.forward_layers(self.embed(input_ids), kv_cache, md, attend, layer_loop)
        return self.final_norm(h), kv_cache

    def embed(self, input_ids: jax.Array) -> jax.Array:
        return constrain(self.embed_tokens.get_value()[input_ids], None, None)

    def final_norm(self, h: jax.Array) -> jax.Array:
        return rms_norm(h, self.norm.get_value(), self.args.rms_norm_eps)

    def forward_layers(self, h: jax.Array, kv_cache: jax.Array, md: AttentionMetadata, attend,
                       layer_loop) -> tuple[jax.Array, jax.Array]:
        """This model's decoder layers over hidden states h; layer i uses kv_cache[i]."""
        a = self.args
        inv_freq = jnp.asarray(compute_inv_freq(a.head_dim, a.rope_theta, dict(a.rope_scaling or ())))
        num_tokens = md.cu_q_lens[md.num_seqs[0]]  # the rest of the token axis is padding
        linear = self.linear_method.apply
        qkv = functools.partial(self.attention_inputs, a, linear,
                                cos_sin=rotary_cos_sin(md.positions, inv_freq), num_tokens=num_tokens)

        def attend_layer(q, k, v, kv_cache, layer):
            return attend(q, k, v, kv_cache, layer, md, a.head_dim ** -0.5, a.sliding_window)

        weights = [{k: v.get_value() for k, v in layer.items()} for layer in self.layers]
        return layer_loop(weights, qkv, attend_layer, self.mlp(num_tokens), h, kv_cache)

    def mlp(self, num_tokens: jax.Array):
        """The layer function after attention: (weights, h, attention output) -> h."""
        return functools.partial(mlp_block, self.args, self.linear_method.apply, num_tokens=num_tokens)

    def compute_logits(self, hidden: jax.Array, num_rows: jax.Array | None = None) -> jax.Array:
        """Logits of hidden's rows; with num_rows, those past it (padding) may be zeros."""
        head = self.embed_tokens.get_value().T if self.lm_head is None else self.lm_head.get_value()
        logits = self.linear_method.apply(hidden, head, num_rows).astype(jnp.float32)
        return constrain(logits, None, M)  # vocab parallel

    def load_hf_weights(self, weights: dict[str, np.ndarray], place=None) -> None:
        """place(name, host_array) -> jax.Array puts each weight on device (default: the
        default device); the tensor-parallel worker passes one that places shard by shard."""
        place = place or hf_weights.default_place
        self.load_weights((name, place(name, value)) for name, value in _from_hf(self, weights))

    def load_weights(self, weights) -> None:
        """(name, array) pairs of the model's weights as loaded (linears [in, *out], on
        device), named as in the parameter tree ('layers.0.qkv_proj'); each linear is stored
        as the linear method keeps it. A tied head the method keeps its own copy of comes
        from the embedding (again whenever the embedding is loaded: updates may be partial)."""
        loaded = set()
        for name, value in weights:
            *layer, leaf = name.split(".")
            if leaf in linear_shapes(self.args):
                value = self.linear_method.process_weights_after_loading(value)
            (self.layers[int(layer[1])][leaf] if layer else getattr(self, leaf)).set_value(value)
            loaded.add(name)
        if self.lm_head is not None and self.args.tie_word_embeddings and "embed_tokens" in loaded:
            self.lm_head.set_value(self.linear_method.process_weights_after_loading(
                self.embed_tokens.get_value().T))


def _from_hf(model: LlamaForCausalLM, weights: dict[str, np.ndarray]):
    """(name, host array) of each weight from a Hugging Face state dict ([out, in] linear
    weights), in the model's layout: linears [in, *out], q/k/v and gate/up fused.

    The model's head counts may be padded for tensor parallelism (distributed.partition.
    padded_heads): checkpoint heads fill the leading slots of each head axis, zeros the rest.
    """
    a = model.args
    dtype = model.embed_tokens.get_value().dtype
    shapes = {name: out for name, (_, out) in linear_shapes(a).items()}
    group, d = a.num_heads // a.num_kv_heads, a.head_dim

    get = functools.partial(hf_weights.get, weights)

    def fit(key, w, shape):
        return hf_weights.fit(key, w, shape, dtype)

    def heads(key, w, n):
        """[n * head_dim, ...] -> [kv heads, n per KV head, head_dim, ...] (KV heads may be few)."""
        if w.shape[0] % (n * d):
            raise ValueError(f"Tensor {key!r} of shape {w.shape} does not fit the model config "
                             f"({n} heads of {d} per KV head).")
        return w.reshape(-1, n, d, *w.shape[1:])

    for i in range(a.num_layers):
        p = f"model.layers.{i}."
        for norm in ("input_layernorm", "post_attention_layernorm"):
            yield f"layers.{i}.{norm}", fit(p + norm, get(f"{p}{norm}.weight"), (a.hidden_size,))
        for kind in ("weight", "bias") if a.attention_bias else ("weight",):
            q, k, v = (get(f"{p}self_attn.{n}_proj.{kind}") for n in "qkv")
            key = f"{p}self_attn.qkv_proj.{kind}"
            if q.shape[0] != k.shape[0] // d * group * d:
                raise ValueError(f"Tensor {key!r}: {q.shape[0] // d} query heads for {k.shape[0] // d} KV "
                                 f"heads do not fit the model config (groups of {group}).")
            qkv = np.concatenate([heads(key, q, group), heads(key, k, 1), heads(key, v, 1)], axis=1)
            # [kv, group + 2, head_dim(, in)] -> [in, kv, group + 2, head_dim] for the weight.
            qkv = qkv.transpose(3, 0, 1, 2) if kind == "weight" else qkv
            shape = (a.hidden_size, *shapes["qkv_proj"]) if kind == "weight" else shapes["qkv_proj"]
            yield f"layers.{i}.qkv_{'proj' if kind == 'weight' else 'bias'}", fit(key, qkv, shape)
        yield f"layers.{i}.o_proj", fit(p + "self_attn.o_proj", get(p + "self_attn.o_proj.weight").T,
                                        (a.num_heads * d, a.hidden_size))
        gate_up = np.stack([get(p + "mlp.gate_proj.weight").T, get(p + "mlp.up_proj.weight").T], axis=1)
        yield f"layers.{i}.gate_up_proj", fit(p + "mlp.gate_up_proj", gate_up,
                                              (a.hidden_size, 2, a.intermediate_size))
        yield f"layers.{i}.down_proj", fit(p + "mlp.down_proj", get(p + "mlp.down_proj.weight").T,
                                           (a.intermediate_size, a.hidden_size))
    # astype(copy=False): each copy of a large weight costs start-up time (page faults included).
    yield "embed_tokens", get("model.embed_tokens.weight").astype(dtype, copy=False)
    yield "norm", get("model.norm.weight").astype(dtype, copy=False)
    if not a.tie_word_embeddings:
        yield "lm_head", fit("lm_head.weight", get("lm_head.weight").T, (a.hidden_size, a.vocab_size))
