"""Qwen3: the Llama decoder with an RMSNorm over each query and key head (q_norm, k_norm:
one weight of head_dim shared by the heads) before the rotary embedding."""
from __future__ import annotations

import dataclasses
import itertools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxvllm.distributed.mesh import MODEL_AXIS as M, constrain
from jaxvllm.layers.rotary import apply_rotary
from jaxvllm.models import hf_weights
from jaxvllm.models.llama import LlamaArgs, LlamaForCausalLM, _from_hf, rms_norm


@dataclasses.dataclass(frozen=True)
class Qwen3Args(LlamaArgs):
    @classmethod
    def from_hf_config(cls, cfg) -> "Qwen3Args":
        if getattr(cfg, "use_sliding_window", False):
            raise ValueError("Qwen3 with use_sliding_window=True (per-layer windows) is not supported.")
        if getattr(cfg, "attention_bias", False):
            raise ValueError("Qwen3 with attention_bias=True is not supported.")
        return super().from_hf_config(cfg)


def attention_inputs(a: Qwen3Args, linear, w: dict, h: jax.Array, *, cos_sin: tuple[jax.Array, jax.Array],
                     num_tokens: jax.Array):
    """As Llama's (models/llama.py), with each query and key head normalized before rotation."""
    T, group = h.shape[0], a.num_heads // a.num_kv_heads
    x = rms_norm(h, w["input_layernorm"], a.rms_norm_eps)
    qkv = linear(x, w["qkv_proj"], num_tokens).reshape(T, a.num_kv_heads, group + 2, a.head_dim)
    qkv = constrain(qkv, None, M, None, None)
    q = rms_norm(qkv[:, :, :group], w["q_norm"], a.rms_norm_eps).reshape(T, a.num_heads, a.head_dim)
    k = rms_norm(qkv[:, :, group], w["k_norm"], a.rms_norm_eps)
    q = constrain(q, None, M, None)
    return apply_rotary(q, cos_sin), apply_rotary(k, cos_sin), qkv[:, :, group + 1]


class Qwen3ForCausalLM(LlamaForCausalLM):
    attention_inputs = staticmethod(attention_inputs)

    def __init__(self, args: Qwen3Args, *, dtype=jnp.float32, linear_method=None):
        super().__init__(args, dtype=dtype, linear_method=linear_method)
        for layer in self.layers:
            layer["q_norm"] = nnx.Param(jnp.ones((args.head_dim,), dtype))
            layer["k_norm"] = nnx.Param(jnp.ones((args.head_dim,), dtype))

    def load_hf_weights(self, weights: dict[str, np.ndarray], place=None) -> None:
        place = place or hf_weights.default_place
        dtype = self.embed_tokens.get_value().dtype
        norms = ((f"layers.{i}.{n}", hf_weights.load(weights, f"model.layers.{i}.self_attn.{n}.weight",
                                                      (self.args.head_dim,), dtype))
                 for i in range(self.args.num_layers) for n in ("q_norm", "k_norm"))
        self.load_weights((name, place(name, value)) for name, value in itertools.chain(_from_hf(self, weights), norms))
