"""Qwen3: the Llama decoder with an RMSNorm over each query and key head (q_norm, k_norm:
one weight of head_dim shared by the heads) before the rotary embedding."""
from __future__ import annotations

import dataclasses

import jax

from jaxvllm.distributed.logical_axes import HEADS, KV_HEADS, SEQUENCE, constrain
from jaxvllm.layers.layernorm import rms_norm
from jaxvllm.layers.rotary import apply_rotary
from jaxvllm.models import llama
from jaxvllm.models.llama import LlamaArgs, LlamaForCausalLM
from jaxvllm.models.weight_spec import Weight, vector


@dataclasses.dataclass(frozen=True)
class Qwen3Args(LlamaArgs):
    @classmethod
    def from_hf_config(cls, cfg) -> "Qwen3Args":
        if getattr(cfg, "attention_bias", False):
            raise ValueError("Qwen3 with attention_bias=True is not supported.")
        args = super().from_hf_config(cfg)
        if args.sliding_window is None:
            return args
        # use_sliding_window: layers from max_window_layers on slide (transformers' layer_types).
        return dataclasses.replace(args, sliding_layers=tuple(t == "sliding_attention" for t in cfg.layer_types))


def attention_inputs(a: LlamaArgs, w: dict, h: jax.Array, *, cos_sin: tuple[jax.Array, jax.Array],
                     num_tokens: jax.Array):
    """As Llama's (models/llama.py), with each query and key head normalized before rotation."""
    T, group = h.shape[0], a.num_heads // a.num_kv_heads
    x = rms_norm(h, w["input_layernorm"], a.rms_norm_eps)
    qkv = w["qkv_proj"](x, num_tokens).reshape(T, a.num_kv_heads, group + 2, a.head_dim)
    qkv = constrain(qkv, SEQUENCE, KV_HEADS, None, None)
    q = rms_norm(qkv[:, :, :group], w["q_norm"], a.rms_norm_eps).reshape(T, a.num_heads, a.head_dim)
    k = rms_norm(qkv[:, :, group], w["k_norm"], a.rms_norm_eps)
    q = constrain(q, SEQUENCE, HEADS, None)
    return apply_rotary(q, cos_sin), apply_rotary(k, cos_sin), qkv[:, :, group + 1]


def qk_norm_weights(a: LlamaArgs) -> list[Weight]:
    return [vector(f"layers.{{i}}.{n}", a.head_dim, f"model.layers.{{i}}.self_attn.{n}.weight", init=1.0)
            for n in ("q_norm", "k_norm")]


def weight_spec(a: Qwen3Args) -> list[Weight]:
    return [*llama.weight_spec(a), *qk_norm_weights(a)]


class Qwen3ForCausalLM(LlamaForCausalLM):
    weight_spec = staticmethod(weight_spec)
    attention_inputs = staticmethod(attention_inputs)
