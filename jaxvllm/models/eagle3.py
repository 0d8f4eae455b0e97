"""The EAGLE-3 draft head for Llama-class targets (vLLM's LlamaForCausalLMEagle3), loading the
published checkpoints' layout (yuhuili/EAGLE3-LLaMA3.1-Instruct-8B and its kind): `fc`,
`midlayer.*`, `norm`, `lm_head` over a draft vocabulary, and `d2t` mapping a draft token to
the target's (target id = draft id + d2t[draft id]). A checkpoint without `embed_tokens`
shares the target's embedding (the worker supplies it).

One step of the head at a position i takes the token at i + 1 and a hidden state for i: at
first the target's, its three captured layers joined by `fc` (`combine`); after that its own
output before the final norm. Its one decoder layer attends over its own KV, normed token
embedding and normed hidden state side by side as the projections' input (2 x hidden), the
hidden state as the residual; the proposer (worker/spec_decode/eagle.py) runs it.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxvllm.distributed.logical_axes import EMBED, HEADS, KV_HEADS, SEQUENCE, VOCAB, constrain
from jaxvllm.layers.layernorm import rms_norm
from jaxvllm.layers.rotary import apply_rotary, compute_inv_freq, rotary_cos_sin
from jaxvllm.models.causal_lm import CausalLM
from jaxvllm.models.llama import LlamaArgs, fuse_qkv_weight, mlp_block, mlp_weights
from jaxvllm.models.weight_spec import Weight, linear, vector


@dataclasses.dataclass(frozen=True)
class Eagle3Args(LlamaArgs):
    draft_vocab_size: int = 0
    target_hidden_size: int = 0
    # The target layers whose inputs it reads (None: vLLM's default, 2, L // 2 and L - 3).
    aux_hidden_state_layer_ids: tuple[int, ...] | None = None

    @classmethod
    def from_hf_config(cls, cfg) -> "Eagle3Args":
        base = LlamaArgs.from_hf_config(cfg)
        eagle = getattr(cfg, "eagle_config", None) or {}
        ids = eagle.get("eagle_aux_hidden_state_layer_ids")
        return cls(**{f.name: getattr(base, f.name) for f in dataclasses.fields(LlamaArgs)},
                   draft_vocab_size=getattr(cfg, "draft_vocab_size", None) or cfg.vocab_size,
                   target_hidden_size=getattr(cfg, "target_hidden_size", None) or cfg.hidden_size,
                   aux_hidden_state_layer_ids=tuple(ids) if ids else None)

    def aux_layers(self, num_target_layers: int) -> tuple[int, ...]:
        if self.aux_hidden_state_layer_ids is not None:
            return self.aux_hidden_state_layer_ids
        return 2, num_target_layers // 2, num_target_layers - 3


def token_map(key: str, d2t):
    """d2t's offsets as the target id of each draft id."""
    return (np.arange(len(d2t)) + d2t).astype(np.int32)


def weight_spec(a: Eagle3Args) -> list[Weight]:
    H, group, d = a.hidden_size, a.num_heads // a.num_kv_heads, a.head_dim
    attn = "midlayer.self_attn."
    return [
        Weight("embed_tokens", (a.vocab_size, H), (VOCAB, EMBED), ("model.embed_tokens.weight",)),
        linear("fc", 3 * a.target_hidden_size, (H,), (None, None), ["fc.weight"]),
        vector("layers.{i}.input_layernorm", H, "midlayer.input_layernorm.weight", init=1.0),
        vector("layers.{i}.hidden_norm", H, "midlayer.hidden_norm.weight", init=1.0),
        linear("layers.{i}.qkv_proj", 2 * H, (a.num_kv_heads, group + 2, d), (EMBED, KV_HEADS, None, None),
               [f"{attn}{n}_proj.weight" for n in "qkv"], functools.partial(fuse_qkv_weight, a),
               name=attn + "qkv_proj.weight"),
        linear("layers.{i}.o_proj", a.num_heads * d, (H,), (HEADS, EMBED), [attn + "o_proj.weight"]),
        vector("layers.{i}.post_attention_layernorm", H, "midlayer.post_attention_layernorm.weight", init=1.0),
        *mlp_weights(a, prefix="midlayer.mlp."),
        vector("norm", H, "norm.weight", init=1.0),
        linear("lm_head", H, (a.draft_vocab_size,), (EMBED, VOCAB), ["lm_head.weight"]),
        Weight("token_map", (a.draft_vocab_size,), (None,), ("d2t",), token_map, dtype="int32"),
    ]


class Eagle3LlamaForCausalLM(CausalLM):
    weight_spec = staticmethod(weight_spec)
    checkpoint_aliases = (("model.embed_tokens.", "embed_tokens."),)

    def load_hf_weights(self, weights, place=None) -> None:
        """A checkpoint whose draft vocabulary is the target's may carry no d2t."""
        if "d2t" not in weights:
            weights = dict(weights, d2t=np.zeros(self.args.draft_vocab_size, np.int64))
        super().load_hf_weights(weights, place)

    def combine(self, aux_hidden: jax.Array, num_tokens: jax.Array) -> jax.Array:
        """The target's captured hidden states [tokens, 3 x its hidden] as the head's input."""
        return self.bind("fc", self.fc.get_value())(aux_hidden, num_tokens)

    def __call__(self, input_ids: jax.Array, hidden: jax.Array, kv_cache: jax.Array, md, attend):
        """(final hidden states, the same before the final norm, the cache) at every token."""
        a, w = self.args, self.layer_weights()[0]
        num_tokens = md.cu_q_lens[md.num_seqs[0]]
        T, group = hidden.shape[0], a.num_heads // a.num_kv_heads
        x = jnp.concatenate([rms_norm(self.embed(input_ids), w["input_layernorm"], a.rms_norm_eps),
                             rms_norm(hidden, w["hidden_norm"], a.rms_norm_eps)], axis=-1)
        qkv = constrain(w["qkv_proj"](x, num_tokens).reshape(T, a.num_kv_heads, group + 2, a.head_dim),
                        SEQUENCE, KV_HEADS, None, None)
        inv_freq = jnp.asarray(compute_inv_freq(a.head_dim, a.rope_theta, dict(a.rope_scaling or ())))
        cos_sin = rotary_cos_sin(md.positions, inv_freq)
        q = constrain(qkv[:, :, :group].reshape(T, a.num_heads, a.head_dim), SEQUENCE, HEADS, None)
        o, kv_cache = attend(apply_rotary(q, cos_sin), apply_rotary(qkv[:, :, group], cos_sin), qkv[:, :, group + 1],
                             kv_cache, 0, md, a.head_dim ** -0.5, None)
        prenorm = mlp_block(a, w, hidden, o, num_tokens=num_tokens)
        return rms_norm(prenorm, self.norm.get_value(), a.rms_norm_eps), prenorm, kv_cache

    def draft_tokens(self, hidden: jax.Array, num_rows: jax.Array, argmax) -> jax.Array:
        """The target's token id of each row's most likely draft token."""
        return self.token_map.get_value()[argmax(self.compute_logits(hidden, num_rows))]

    def sliding_windows(self) -> list[int | None]:
        return [None]
