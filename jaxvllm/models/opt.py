"""OPT (facebook/opt-*): learned positions (offset 2), LayerNorm with biases, ReLU MLP,
biases on every projection, and project_in/project_out where the embedding is narrower than
the hidden size (opt-350m). Multi-head attention: its q/k/v are fused as Llama's are, groups
of one query head (models/llama.py)."""
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
from jaxvllm.models.hf_weights import default_place, fit, get, load

POSITION_OFFSET = 2  # OPT's position table starts two rows in (a fairseq padding convention)


@dataclasses.dataclass(frozen=True)
class OPTArgs:
    vocab_size: int
    hidden_size: int
    intermediate_size: int  # ffn_dim
    num_layers: int
    num_heads: int
    num_kv_heads: int  # = num_heads (kept apart so that heads can be padded for tensor parallelism)
    head_dim: int
    word_embed_proj_dim: int
    max_position_embeddings: int
    do_layer_norm_before: bool
    final_layer_norm: bool
    tie_word_embeddings: bool

    @classmethod
    def from_hf_config(cls, cfg) -> "OPTArgs":
        if cfg.activation_function != "relu":
            raise ValueError(f"OPT with activation_function={cfg.activation_function!r} is not supported (relu).")
        if not cfg.enable_bias or not cfg.layer_norm_elementwise_affine:
            raise ValueError("OPT without enable_bias or layer_norm_elementwise_affine is not supported.")
        return cls(
            vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.ffn_dim,
            num_layers=cfg.num_hidden_layers, num_heads=cfg.num_attention_heads,
            num_kv_heads=cfg.num_attention_heads, head_dim=cfg.hidden_size // cfg.num_attention_heads,
            word_embed_proj_dim=cfg.word_embed_proj_dim, max_position_embeddings=cfg.max_position_embeddings,
            do_layer_norm_before=cfg.do_layer_norm_before,
            final_layer_norm=cfg.do_layer_norm_before and not cfg._remove_final_layer_norm,
            tie_word_embeddings=bool(cfg.tie_word_embeddings))


def layer_norm(x: jax.Array, weight: jax.Array, bias: jax.Array, eps: float = 1e-5) -> jax.Array:
    x32 = x.astype(jnp.float32)
    x32 = x32 - x32.mean(axis=-1, keepdims=True)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (x32 * weight + bias).astype(x.dtype)


def attention_inputs(a: OPTArgs, linear, w: dict, h: jax.Array, *, num_tokens: jax.Array):
    T = h.shape[0]
    x = layer_norm(h, w["self_attn_layer_norm"], w["self_attn_layer_norm_bias"]) if a.do_layer_norm_before else h
    qkv = linear(x, w["qkv_proj"], num_tokens).reshape(T, a.num_kv_heads, 3, a.head_dim) + w["qkv_bias"]
    qkv = constrain(qkv, None, M, None, None)
    return qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]


def mlp_block(a: OPTArgs, linear, w: dict, h: jax.Array, o: jax.Array, *, num_tokens: jax.Array) -> jax.Array:
    T = h.shape[0]
    h = constrain(h + linear(o.reshape(T, -1), w["o_proj"], num_tokens) + w["o_bias"], None, None)
    if not a.do_layer_norm_before:
        h = layer_norm(h, w["self_attn_layer_norm"], w["self_attn_layer_norm_bias"])
    x = layer_norm(h, w["final_layer_norm"], w["final_layer_norm_bias"]) if a.do_layer_norm_before else h
    up = constrain(jax.nn.relu(linear(x, w["fc1"], num_tokens) + w["fc1_bias"]), None, M)
    h = constrain(h + linear(up, w["fc2"], num_tokens) + w["fc2_bias"], None, None)
    return h if a.do_layer_norm_before else layer_norm(h, w["final_layer_norm"], w["final_layer_norm_bias"])


def linear_shapes(a: OPTArgs) -> dict[str, tuple[int, tuple[int, ...]]]:
    shapes = {
        "qkv_proj": (a.hidden_size, (a.num_kv_heads, 3, a.head_dim)),
        "o_proj": (a.num_heads * a.head_dim, (a.hidden_size,)),
        "fc1": (a.hidden_size, (a.intermediate_size,)),
        "fc2": (a.intermediate_size, (a.hidden_size,)),
        "lm_head": (a.word_embed_proj_dim, (a.vocab_size,)),
    }
    if a.word_embed_proj_dim != a.hidden_size:
        shapes.update(project_in=(a.word_embed_proj_dim, (a.hidden_size,)),
                      project_out=(a.hidden_size, (a.word_embed_proj_dim,)))
    return shapes


def _layer_shapes(a: OPTArgs) -> dict[str, tuple[int, ...]]:
    """The non-linear weights of a layer."""
    d = a.hidden_size
    return {"self_attn_layer_norm": (d,), "self_attn_layer_norm_bias": (d,), "final_layer_norm": (d,),
            "final_layer_norm_bias": (d,), "qkv_bias": (a.num_kv_heads, 3, a.head_dim), "o_bias": (d,),
            "fc1_bias": (a.intermediate_size,), "fc2_bias": (d,)}


class OPTForCausalLM(nnx.Module):
    linear_shapes = staticmethod(linear_shapes)

    def __init__(self, args: OPTArgs, *, dtype=jnp.float32, linear_method=None):
        """Zeros, filled by load_weights (as LlamaForCausalLM's)."""
        self.args = a = args
        self.linear_method = m = linear_method or UnquantizedLinearMethod()
        linears = linear_shapes(a)
        self.embed_tokens = nnx.Param(jnp.zeros((a.vocab_size, a.word_embed_proj_dim), dtype))
        self.embed_positions = nnx.Param(jnp.zeros((a.max_position_embeddings + POSITION_OFFSET, a.hidden_size), dtype))
        layer = {name: m.weight_shape(*linears[name]) for name in ("qkv_proj", "o_proj", "fc1", "fc2")}
        layer.update(_layer_shapes(a))
        self.layers = nnx.List([nnx.Dict({name: nnx.Param(jnp.zeros(s, dtype)) for name, s in layer.items()})
                                for _ in range(a.num_layers)])
        self.final_layer_norm = nnx.Param(jnp.ones((a.hidden_size,), dtype)) if a.final_layer_norm else None
        self.final_layer_norm_bias = nnx.Param(jnp.zeros((a.hidden_size,), dtype)) if a.final_layer_norm else None
        projected = "project_in" in linears
        self.project_in = nnx.Param(jnp.zeros(m.weight_shape(*linears["project_in"]), dtype)) if projected else None
        self.project_out = nnx.Param(jnp.zeros(m.weight_shape(*linears["project_out"]), dtype)) if projected else None
        own_head = not a.tie_word_embeddings or m.copies_tied_head
        self.lm_head = nnx.Param(jnp.zeros(m.weight_shape(*linears["lm_head"]), dtype)) if own_head else None

    def __call__(self, input_ids: jax.Array, kv_cache: jax.Array, md: AttentionMetadata,
                 attend, layer_loop) -> tuple[jax.Array, jax.Array]:
        """As LlamaForCausalLM's: final hidden states [tokens, hidden] (before project_out,
        which compute_logits applies) and the updated cache."""
        a = self.args
        num_tokens = md.cu_q_lens[md.num_seqs[0]]
        linear = self.linear_method.apply
        qkv = functools.partial(attention_inputs, a, linear, num_tokens=num_tokens)
        mlp = functools.partial(mlp_block, a, linear, num_tokens=num_tokens)

        def attend_layer(q, k, v, kv_cache, layer):
            return attend(q, k, v, kv_cache, layer, md, a.head_dim ** -0.5)

        weights = [{k: v.get_value() for k, v in layer.items()} for layer in self.layers]
        h = self.embed_tokens.get_value()[input_ids]
        if self.project_in is not None:
            h = linear(h, self.project_in.get_value(), num_tokens)
        h = constrain(h + self.embed_positions.get_value()[md.positions + POSITION_OFFSET], None, None)
        h, kv_cache = layer_loop(weights, qkv, attend_layer, mlp, h, kv_cache)
        if self.final_layer_norm is not None:
            h = layer_norm(h, self.final_layer_norm.get_value(), self.final_layer_norm_bias.get_value())
        return h, kv_cache

    def compute_logits(self, hidden: jax.Array, num_rows: jax.Array | None = None) -> jax.Array:
        if self.project_out is not None:
            hidden = self.linear_method.apply(hidden, self.project_out.get_value(), num_rows)
        head = self.embed_tokens.get_value().T if self.lm_head is None else self.lm_head.get_value()
        logits = self.linear_method.apply(hidden, head, num_rows).astype(jnp.float32)
        return constrain(logits, None, M)

    def load_hf_weights(self, weights: dict[str, np.ndarray], place=None) -> None:
        place = place or default_place
        # facebook/opt-* checkpoints name the decoder without the "model." that transformers writes.
        weights = {f"model.{k}" if k.startswith("decoder.") else k: v for k, v in weights.items()}
        self.load_weights((name, place(name, value)) for name, value in _from_hf(self, weights))

    def load_weights(self, weights) -> None:
        """(name, array) pairs as LlamaForCausalLM.load_weights takes them."""
        linears, loaded = linear_shapes(self.args), set()
        for name, value in weights:
            *layer, leaf = name.split(".")
            if leaf in linears:
                value = self.linear_method.process_weights_after_loading(value)
            (self.layers[int(layer[1])][leaf] if layer else getattr(self, leaf)).set_value(value)
            loaded.add(name)
        if self.lm_head is not None and self.args.tie_word_embeddings and "embed_tokens" in loaded:
            self.lm_head.set_value(self.linear_method.process_weights_after_loading(self.embed_tokens.get_value().T))


def _from_hf(model: OPTForCausalLM, weights: dict[str, np.ndarray]):
    """(name, host array) in the model's layout: linears [in, *out], q/k/v fused per head;
    heads padded for tensor parallelism get zeros."""
    a, dtype = model.args, model.embed_tokens.get_value().dtype
    d, heads = a.head_dim, a.num_kv_heads
    for i in range(a.num_layers):
        p, n = f"model.decoder.layers.{i}.", f"layers.{i}."
        for norm in ("self_attn_layer_norm", "final_layer_norm"):
            yield n + norm, load(weights, f"{p}{norm}.weight", (a.hidden_size,), dtype)
            yield n + norm + "_bias", load(weights, f"{p}{norm}.bias", (a.hidden_size,), dtype)
        q, k, v = (get(weights, f"{p}self_attn.{x}_proj.weight") for x in "qkv")
        key = p + "self_attn.qkv_proj.weight"
        if not q.shape == k.shape == v.shape or q.shape[0] % d:
            raise ValueError(f"Tensor {key!r}: q/k/v of shapes {q.shape}, {k.shape}, {v.shape} do not fit "
                             f"the model config (heads of {d}).")
        qkv = np.stack([x.reshape(-1, d, x.shape[1]) for x in (q, k, v)], axis=1)  # [heads, 3, d, in]
        yield n + "qkv_proj", fit(key, qkv.transpose(3, 0, 1, 2), (a.hidden_size, heads, 3, d), dtype)
        bias = np.stack([get(weights, f"{p}self_attn.{x}_proj.bias").reshape(-1, d) for x in "qkv"], axis=1)
        yield n + "qkv_bias", fit(p + "self_attn.qkv_proj.bias", bias, (heads, 3, d), dtype)
        key = p + "self_attn.out_proj.weight"
        yield n + "o_proj", fit(key, get(weights, key).T, (heads * d, a.hidden_size), dtype)
        yield n + "o_bias", load(weights, p + "self_attn.out_proj.bias", (a.hidden_size,), dtype)
        for fc, (rows, cols) in (("fc1", (a.intermediate_size, a.hidden_size)),
                                 ("fc2", (a.hidden_size, a.intermediate_size))):
            yield n + fc, fit(f"{p}{fc}.weight", get(weights, f"{p}{fc}.weight").T, (cols, rows), dtype)
            yield n + fc + "_bias", load(weights, f"{p}{fc}.bias", (rows,), dtype)
    p = "model.decoder."
    yield "embed_tokens", load(weights, p + "embed_tokens.weight", (a.vocab_size, a.word_embed_proj_dim), dtype)
    yield "embed_positions", load(weights, p + "embed_positions.weight",
                                  (a.max_position_embeddings + POSITION_OFFSET, a.hidden_size), dtype)
    if a.final_layer_norm:
        yield "final_layer_norm", load(weights, p + "final_layer_norm.weight", (a.hidden_size,), dtype)
        yield "final_layer_norm_bias", load(weights, p + "final_layer_norm.bias", (a.hidden_size,), dtype)
    if model.project_in is not None:
        for proj, shape in (("project_in", (a.word_embed_proj_dim, a.hidden_size)),
                            ("project_out", (a.hidden_size, a.word_embed_proj_dim))):
            key = f"{p}{proj}.weight"
            yield proj, fit(key, get(weights, key).T, shape, dtype)
    if not a.tie_word_embeddings:
        yield "lm_head", fit("lm_head.weight", get(weights, "lm_head.weight").T,
                             (a.word_embed_proj_dim, a.vocab_size), dtype)
