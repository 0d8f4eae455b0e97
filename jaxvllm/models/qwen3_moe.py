"""Qwen3-MoE and Qwen2-MoE: Mixtral's decoder (models/mixtral.py) under Qwen's weight names.
Qwen3-MoE normalizes each query and key head (RMSNorm over head_dim) before RoPE; Qwen2-MoE
has q/k/v biases and a shared expert beside the routed ones, gated per token."""
from __future__ import annotations

from jaxvllm.models import qwen3
from jaxvllm.models.mixtral import MixtralForCausalLM


class Qwen2MoeForCausalLM(MixtralForCausalLM):
    hf_router = "mlp.gate"
    hf_expert = "mlp.experts.{e}.{part}"
    hf_expert_parts = ("gate_proj", "up_proj", "down_proj")


class Qwen3MoeForCausalLM(Qwen2MoeForCausalLM):
    attention_inputs = staticmethod(qwen3.attention_inputs)
    qk_norm = True
