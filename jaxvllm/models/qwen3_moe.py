"""Qwen3-MoE: Mixtral's decoder (models/mixtral.py) under Qwen's weight names, each query
and key head normalized (RMSNorm over head_dim) before RoPE as in Qwen3 (models/qwen3.py)."""
from __future__ import annotations

from jaxvllm.models import mixtral, qwen3
from jaxvllm.models.mixtral import MixtralForCausalLM, MoeArgs
from jaxvllm.models.weight_spec import Weight

QWEN_EXPERTS = ("mlp.gate", "mlp.experts.{e}.{part}", ("gate_proj", "up_proj", "down_proj"))


def weight_spec(a: MoeArgs) -> list[Weight]:
    return [*mixtral.moe_layer_weights(a), *qwen3.qk_norm_weights(a), *mixtral.expert_weights(a, *QWEN_EXPERTS)]


class Qwen3MoeForCausalLM(MixtralForCausalLM):
    weight_spec = staticmethod(weight_spec)
    attention_inputs = staticmethod(qwen3.attention_inputs)
