"""Qwen2-MoE: Mixtral's decoder (models/mixtral.py) under Qwen's weight names, with q/k/v
biases and a shared expert beside the routed ones: Llama's dense MLP, gated per token by a
sigmoid of its own [hidden, 1] projection."""
from __future__ import annotations

import jax

from jaxvllm.distributed.logical_axes import EMBED, SEQUENCE, constrain
from jaxvllm.layers.layernorm import rms_norm
from jaxvllm.models import llama, mixtral
from jaxvllm.models.mixtral import MixtralForCausalLM, MoeArgs
from jaxvllm.models.weight_spec import Weight, transpose

QWEN_EXPERTS = ("mlp.gate", "mlp.experts.{e}.{part}", ("gate_proj", "up_proj", "down_proj"))


def moe_block(a: MoeArgs, moe_method, w: dict, h: jax.Array, o: jax.Array, *, num_tokens: jax.Array) -> jax.Array:
    """Mixtral's block, with the gated shared expert added to the routed ones' output."""
    h = constrain(h + w["o_proj"](o.reshape(h.shape[0], -1), num_tokens), SEQUENCE, EMBED)
    x = rms_norm(h, w["post_attention_layernorm"], a.rms_norm_eps)
    out = mixtral.routed_experts(a, moe_method, w, x)
    if a.intermediate_size:
        out = out + jax.nn.sigmoid(x @ w["shared_expert_gate"]) * llama.dense_mlp(a, w, x, num_tokens)
    return constrain(h + out, SEQUENCE, EMBED)


def shared_expert_weights(a: MoeArgs) -> list[Weight]:
    if not a.intermediate_size:
        return []
    p = "model.layers.{i}.mlp."
    return [*llama.mlp_weights(a, p + "shared_expert."),
            Weight("layers.{i}.shared_expert_gate", (a.hidden_size, 1), (None, None),
                   (p + "shared_expert_gate.weight",), transpose, source_shape=(1, a.hidden_size))]


def weight_spec(a: MoeArgs) -> list[Weight]:
    return [*mixtral.moe_layer_weights(a), *mixtral.expert_weights(a, *QWEN_EXPERTS), *shared_expert_weights(a)]


class Qwen2MoeForCausalLM(MixtralForCausalLM):
    weight_spec = staticmethod(weight_spec)
    block = staticmethod(moe_block)
