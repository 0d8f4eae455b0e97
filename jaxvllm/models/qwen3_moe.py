"""Qwen3-MoE and Qwen2-MoE: Mixtral's decoder (models/mixtral.py) under Qwen's weight names.
Qwen3-MoE normalizes each query and key head (RMSNorm over head_dim) before RoPE; Qwen2-MoE
has q/k/v biases and a shared expert beside the routed ones, gated per token."""
from __future__ import annotations

import jax

from jaxvllm.distributed.mesh import MODEL_AXIS as M, constrain
from jaxvllm.layers.rotary import apply_rotary
from jaxvllm.models.llama import LlamaArgs, rms_norm
from jaxvllm.models.mixtral import MixtralForCausalLM


def qk_norm_attention_inputs(a: LlamaArgs, linear, w: dict, h: jax.Array, *, positions: jax.Array,
                             inv_freq: jax.Array, num_tokens: jax.Array):
    """llama.attention_inputs with q and k RMS-normalized per head before rotation."""
    T, group = h.shape[0], a.num_heads // a.num_kv_heads
    x = rms_norm(h, w["input_layernorm"], a.rms_norm_eps)
    qkv = linear(x, w["qkv_proj"], num_tokens).reshape(T, a.num_kv_heads, group + 2, a.head_dim)
    if a.attention_bias:
        qkv = qkv + w["qkv_bias"]
    qkv = constrain(qkv, None, M, None, None)
    q = constrain(qkv[:, :, :group].reshape(T, a.num_heads, a.head_dim), None, M, None)
    q = rms_norm(q, w["q_norm"], a.rms_norm_eps)
    k = rms_norm(qkv[:, :, group], w["k_norm"], a.rms_norm_eps)
    return apply_rotary(q, positions, inv_freq), apply_rotary(k, positions, inv_freq), qkv[:, :, group + 1]


class Qwen2MoeForCausalLM(MixtralForCausalLM):
    hf_router = "mlp.gate"
    hf_expert = "mlp.experts.{e}.{part}"
    hf_expert_parts = ("gate_proj", "up_proj", "down_proj")


class Qwen3MoeForCausalLM(Qwen2MoeForCausalLM):
    attention_inputs = staticmethod(qk_norm_attention_inputs)
    qk_norm = True
