"""Gemma 2 and Gemma 3 (text) decoders: the embedding scaled by sqrt(hidden), (1 + w)
RMSNorms before and after both attention and MLP, GeGLU (tanh GELU), queries scaled by
query_pre_attn_scalar**-0.5, sliding-window layers interleaved with global ones, tanh
soft-capping of attention scores and final logits (Gemma 2), per-head q/k norms and a rope
base of their own for the sliding-window layers (Gemma 3).

The weights are Llama's attention and MLP (models/llama.py) and Gemma's four norms per layer
(Gemma 3: and the q/k norms), all of them offsets from 1. The layer loop gets (layer index,
weights) pairs: the index picks the layer's rope statically; the layer's window is a value
the attention kernels take.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from jaxvllm.distributed.logical_axes import EMBED, HEADS, KV_HEADS, MLP, SEQUENCE, constrain
from jaxvllm.layers.attention import AttentionMetadata
from jaxvllm.layers.layernorm import gemma_rms_norm
from jaxvllm.layers.rotary import apply_rotary, compute_inv_freq, rotary_cos_sin
from jaxvllm.models import llama
from jaxvllm.models.causal_lm import CausalLM
from jaxvllm.models.llama import LlamaArgs
from jaxvllm.models.weight_spec import Weight, vector


@dataclasses.dataclass(frozen=True)
class GemmaArgs(LlamaArgs):
    query_pre_attn_scalar: float = 256.0
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None
    local_rope_theta: float | None = None    # Gemma 3: the sliding layers' rope base
    qk_norm: bool = False                    # Gemma 3

    @classmethod
    def from_hf_config(cls, cfg) -> "GemmaArgs":
        act = getattr(cfg, "hidden_activation", None) or getattr(cfg, "hidden_act", "gelu_pytorch_tanh")
        if act != "gelu_pytorch_tanh":
            raise ValueError(f"Gemma with hidden_activation={act!r} is not supported (gelu_pytorch_tanh).")
        if getattr(cfg, "attention_bias", False) or getattr(cfg, "use_bidirectional_attention", False):
            raise ValueError("Gemma with attention_bias or use_bidirectional_attention is not supported.")
        rope, local = dict(cfg.rope_parameters), None
        if "full_attention" in rope:  # Gemma 3: one rope per layer type
            local, rope = rope["sliding_attention"], dict(rope["full_attention"])
            if local.get("rope_type", "default") != "default":
                raise ValueError(f"Gemma 3 sliding-layer rope_type {local['rope_type']!r} is not supported.")
        theta = rope.pop("rope_theta")
        return cls(
            vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
            num_layers=cfg.num_hidden_layers, num_heads=cfg.num_attention_heads,
            num_kv_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim, rms_norm_eps=cfg.rms_norm_eps,
            rope_theta=float(theta),
            rope_scaling=tuple(sorted(rope.items())) if rope.get("rope_type", "default") != "default" else None,
            tie_word_embeddings=bool(cfg.tie_word_embeddings), attention_bias=False,
            max_position_embeddings=cfg.max_position_embeddings, sliding_window=cfg.sliding_window,
            query_pre_attn_scalar=float(cfg.query_pre_attn_scalar),
            attn_logit_softcapping=cfg.attn_logit_softcapping,
            final_logit_softcapping=cfg.final_logit_softcapping,
            sliding_layers=tuple(t == "sliding_attention" for t in cfg.layer_types),
            local_rope_theta=None if local is None else float(local["rope_theta"]),
            qk_norm=cfg.model_type == "gemma3_text")


def attention_inputs(a: GemmaArgs, layer: tuple[int, dict], h: jax.Array, *, cos_sins: tuple,
                     num_tokens: jax.Array):
    """q, k, v of one layer (Llama's fused projection); cos_sins: the step's `rotary_cos_sin`
    for the global layers and for the sliding ones."""
    i, w = layer
    T, group = h.shape[0], a.num_heads // a.num_kv_heads
    x = gemma_rms_norm(h, w["input_layernorm"], a.rms_norm_eps)
    qkv = w["qkv_proj"](x, num_tokens).reshape(T, a.num_kv_heads, group + 2, a.head_dim)
    qkv = constrain(qkv, SEQUENCE, KV_HEADS, None, None)
    q, k = qkv[:, :, :group], qkv[:, :, group]
    if a.qk_norm:
        q, k = gemma_rms_norm(q, w["q_norm"], a.rms_norm_eps), gemma_rms_norm(k, w["k_norm"], a.rms_norm_eps)
    q = constrain(q.reshape(T, a.num_heads, a.head_dim), SEQUENCE, HEADS, None)
    cos_sin = cos_sins[1] if a.sliding_layers[i] and a.local_rope_theta else cos_sins[0]
    return apply_rotary(q, cos_sin), apply_rotary(k, cos_sin), qkv[:, :, group + 1]


def mlp_block(a: GemmaArgs, layer: tuple[int, dict], h: jax.Array, o: jax.Array, *,
              num_tokens: jax.Array) -> jax.Array:
    """Output projection, normed, residual; pre-norm, GeGLU MLP, post-norm, residual."""
    _, w = layer
    T, eps = h.shape[0], a.rms_norm_eps
    attn = constrain(w["o_proj"](o.reshape(T, -1), num_tokens), SEQUENCE, EMBED)
    h = h + gemma_rms_norm(attn, w["post_attention_layernorm"], eps)
    x = gemma_rms_norm(h, w["pre_feedforward_layernorm"], eps)
    gate_up = w["gate_up_proj"](x, num_tokens).reshape(T, 2, a.intermediate_size)
    up = constrain(jax.nn.gelu(gate_up[:, 0], approximate=True) * gate_up[:, 1], SEQUENCE, MLP)
    out = constrain(w["down_proj"](up, num_tokens), SEQUENCE, EMBED)
    return h + gemma_rms_norm(out, w["post_feedforward_layernorm"], eps)


def soft_cap(x: jax.Array, cap: float | None) -> jax.Array:
    return x if cap is None else cap * jnp.tanh(x / cap)


def weight_spec(a: GemmaArgs) -> list[Weight]:
    p = "model.layers.{i}."
    norms = ["input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
             "post_feedforward_layernorm"] + (["self_attn.q_norm", "self_attn.k_norm"] if a.qk_norm else [])
    return [*llama.model_weights(a),
            *(w for w in llama.attention_weights(a) if w.path != "layers.{i}.input_layernorm"),
            *llama.mlp_weights(a),
            *(vector("layers.{i}." + n.removeprefix("self_attn."), a.head_dim if n.startswith("self_attn.") else
                     a.hidden_size, f"{p}{n}.weight") for n in norms)]


class GemmaForCausalLM(CausalLM):
    weight_spec = staticmethod(weight_spec)

    def embed(self, input_ids: jax.Array) -> jax.Array:
        rows = self.embedding_rows(input_ids)
        return constrain(rows * jnp.asarray(self.args.hidden_size ** 0.5, rows.dtype), SEQUENCE, EMBED)

    def final_norm(self, h: jax.Array) -> jax.Array:
        return gemma_rms_norm(h, self.norm.get_value(), self.args.rms_norm_eps)

    def forward_layers(self, h: jax.Array, kv_cache: jax.Array, md: AttentionMetadata, attend,
                       layer_loop) -> tuple[jax.Array, jax.Array]:
        a = self.args
        inv_freqs = (compute_inv_freq(a.head_dim, a.rope_theta, dict(a.rope_scaling or ())),
                     compute_inv_freq(a.head_dim, a.local_rope_theta or a.rope_theta, None))
        cos_sins = tuple(rotary_cos_sin(md.positions, inv_freq) for inv_freq in inv_freqs)
        num_tokens = md.cu_q_lens[md.num_seqs[0]]
        qkv = functools.partial(attention_inputs, a, cos_sins=cos_sins, num_tokens=num_tokens)
        mlp = functools.partial(mlp_block, a, num_tokens=num_tokens)
        windows = llama.sliding_windows(a)

        def attend_layer(q, k, v, kv_cache, layer):
            window = windows[layer] if isinstance(windows, jax.Array) else windows
            return attend(q, k, v, kv_cache, layer, md, a.query_pre_attn_scalar ** -0.5, window,
                          a.attn_logit_softcapping)

        return layer_loop(list(enumerate(self.layer_weights())), qkv, attend_layer, mlp, h, kv_cache)

    def compute_logits(self, hidden: jax.Array, num_rows: jax.Array | None = None) -> jax.Array:
        return soft_cap(super().compute_logits(hidden, num_rows), self.args.final_logit_softcapping)
