"""Mixtral: Llama's attention (models/llama.py) and an MLP of routed experts
(layers/fused_moe.py); the MoE families beside it (qwen2_moe.py, qwen3_moe.py) build on its
public parts.

A layer's weights are Llama's attention weights plus the router `[hidden, experts]` and the
stacked experts (gate/up `[experts, hidden, 2, intermediate]`, down `[experts, intermediate,
hidden]`), split on their intermediate features, or whole experts per device under expert
parallelism. The router is a plain XLA matmul, not a linear layer's: its few output columns
(8 experts for Mixtral) are not a multiple of the packed CPU kernel's panel, and a method
that cannot take one weight runs none (models/model_loader.py).
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import numpy as np

from jaxvllm.distributed.logical_axes import EMBED, SEQUENCE, constrain
from jaxvllm.layers.fused_moe import DOWN_AXES, GATE_UP_AXES, fused_moe, select_experts
from jaxvllm.layers.layernorm import rms_norm
from jaxvllm.models import llama
from jaxvllm.models.llama import LlamaArgs, LlamaForCausalLM
from jaxvllm.models.weight_spec import EXPERTS, Weight, transpose, vector


@dataclasses.dataclass(frozen=True)
class MoeArgs(LlamaArgs):
    """Llama's fields (intermediate_size: a shared expert's, 0 without one) and the experts'."""
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True  # renormalize the top-k router probabilities
    expert_parallel: bool = False  # experts split over the mesh (set by get_model)

    @classmethod
    def from_hf_config(cls, cfg) -> "MoeArgs":
        if getattr(cfg, "mlp_only_layers", None) or getattr(cfg, "decoder_sparse_step", 1) != 1:
            raise ValueError(f"{cfg.model_type}: dense layers between the MoE layers (mlp_only_layers="
                             f"{cfg.mlp_only_layers}, decoder_sparse_step={cfg.decoder_sparse_step}) "
                             f"are not supported.")
        args = super().from_hf_config(cfg)
        return dataclasses.replace(
            args,
            intermediate_size=getattr(cfg, "shared_expert_intermediate_size", 0) or 0,
            attention_bias=bool(getattr(cfg, "qkv_bias", args.attention_bias)),
            num_experts=getattr(cfg, "num_local_experts", None) or cfg.num_experts,
            num_experts_per_tok=cfg.num_experts_per_tok,
            moe_intermediate_size=getattr(cfg, "moe_intermediate_size", None) or cfg.intermediate_size,
            norm_topk_prob=bool(getattr(cfg, "norm_topk_prob", True)))


def routed_experts(a: MoeArgs, moe_method, w: dict, x: jax.Array) -> jax.Array:
    """The router's top-k experts of each token of x, through the grouped matmul."""
    weights, ids = select_experts(x @ w["router"], a.num_experts_per_tok, a.norm_topk_prob)
    return fused_moe(moe_method, x, w["experts_gate_up"], w["experts_down"], weights, ids, a.expert_parallel)


def moe_block(a: MoeArgs, moe_method, w: dict, h: jax.Array, o: jax.Array, *, num_tokens: jax.Array) -> jax.Array:
    """The rest of a layer after attention: output projection, residual, routed experts, residual."""
    h = constrain(h + w["o_proj"](o.reshape(h.shape[0], -1), num_tokens), SEQUENCE, EMBED)
    x = rms_norm(h, w["post_attention_layernorm"], a.rms_norm_eps)
    return constrain(h + routed_experts(a, moe_method, w, x), SEQUENCE, EMBED)


def stack_gate_up(key: str, *gate_up):
    """E gate then E up [intermediate, hidden] tensors -> [E, hidden, 2, intermediate]."""
    E = len(gate_up) // 2
    return np.stack([np.stack([g.T, u.T], axis=1) for g, u in zip(gate_up[:E], gate_up[E:])])


def stack_down(key: str, *down):
    return np.stack([d.T for d in down])


def expert_weights(a: MoeArgs, router: str, expert: str, parts: tuple[str, str, str]) -> list[Weight]:
    """The router and the stacked experts. router: its checkpoint name under the layer's
    prefix; expert: expert {e}'s part {part} there; parts: the names of gate, up and down."""
    p, E, H, I = "model.layers.{i}.", a.num_experts, a.hidden_size, a.moe_intermediate_size
    src = lambda part: [p + expert.format(e=e, part=part) + ".weight" for e in range(E)]
    return [
        Weight("layers.{i}.router", (H, E), (EMBED, None), (f"{p}{router}.weight",), transpose,
               source_shape=(E, H)),
        Weight("layers.{i}.experts_gate_up", (E, H, 2, I), GATE_UP_AXES, (*src(parts[0]), *src(parts[1])),
               stack_gate_up, EXPERTS, source_shape=(I, H), name=p + "experts_gate_up"),
        Weight("layers.{i}.experts_down", (E, I, H), DOWN_AXES, tuple(src(parts[2])), stack_down, EXPERTS,
               source_shape=(H, I), name=p + "experts_down"),
    ]


def moe_layer_weights(a: MoeArgs) -> list[Weight]:
    """Llama's embedding, head and attention with the post-attention norm: what every MoE
    family here shares besides its experts."""
    return [*llama.model_weights(a), *llama.attention_weights(a),
            vector("layers.{i}.post_attention_layernorm", a.hidden_size,
                   "model.layers.{i}.post_attention_layernorm.weight", init=1.0)]


def weight_spec(a: MoeArgs) -> list[Weight]:
    return [*moe_layer_weights(a),
            *expert_weights(a, "block_sparse_moe.gate", "block_sparse_moe.experts.{e}.{part}", ("w1", "w3", "w2"))]


class MixtralForCausalLM(LlamaForCausalLM):
    """Llama's embedding, attention, final norm and head; routed experts for the MLP."""
    weight_spec = staticmethod(weight_spec)

    block = staticmethod(moe_block)

    def mlp(self, num_tokens: jax.Array):
        return functools.partial(self.block, self.args, self.quant_config.moe_method, num_tokens=num_tokens)
