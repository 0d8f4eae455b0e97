"""Mixture-of-experts decoders (Mixtral; Qwen3-MoE and Qwen2-MoE in qwen3_moe.py): Llama's
attention (models/llama.py), and an MLP of routed experts (layers/fused_moe.py).

A layer's weights are Llama's attention weights plus the router `[hidden, experts]` and the
stacked experts (gate/up `[experts, hidden, 2, intermediate]`, down `[experts, intermediate,
hidden]`). The router is a plain XLA matmul, not the linear method's: its few output columns
(8 experts for Mixtral) are not a multiple of the packed CPU kernel's panel, and a method
that cannot take one weight runs none (models/model_loader.py). A shared expert (Qwen2-MoE)
is Llama's dense MLP under Llama's weight names, through the linear method.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxvllm.distributed.mesh import MODEL_AXIS as M, constrain
from jaxvllm.layers.fused_moe import UnquantizedFusedMoEMethod, fused_moe, select_experts
from jaxvllm.models import hf_weights, llama
from jaxvllm.models.llama import LlamaArgs, LlamaForCausalLM, rms_norm

_DENSE_MLP = ("gate_up_proj", "down_proj")
_EXPERTS = ("experts_gate_up", "experts_down")


@dataclasses.dataclass(frozen=True)
class MoeArgs(LlamaArgs):
    """Llama's fields (intermediate_size: the shared expert's, 0 without one) and the experts'."""
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


def moe_block(a: MoeArgs, linear, moe_method, w: dict, h: jax.Array, o: jax.Array, *,
              num_tokens: jax.Array) -> jax.Array:
    """The rest of a layer after attention: output projection, residual, routed experts
    (plus the gated shared expert where there is one), residual."""
    T = h.shape[0]
    h = constrain(h + linear(o.reshape(T, -1), w["o_proj"], num_tokens), None, None)
    x = rms_norm(h, w["post_attention_layernorm"], a.rms_norm_eps)
    weights, ids = select_experts(x @ w["router"], a.num_experts_per_tok, a.norm_topk_prob)
    out = fused_moe(moe_method, x, w["experts_gate_up"], w["experts_down"], weights, ids,
                    a.expert_parallel)
    if a.intermediate_size:
        gate_up = linear(x, w["gate_up_proj"], num_tokens).reshape(T, 2, a.intermediate_size)
        up = constrain(jax.nn.silu(gate_up[:, 0]) * gate_up[:, 1], None, M)
        shared = linear(up, w["down_proj"], num_tokens)
        out = out + jax.nn.sigmoid(x @ w["shared_expert_gate"]) * shared
    return constrain(h + out, None, None)


def linear_shapes(a: MoeArgs) -> dict[str, tuple[int, tuple[int, ...]]]:
    """The matmul weights the linear method takes: attention, LM head, a shared expert."""
    return {name: shape for name, shape in llama.linear_shapes(a).items()
            if a.intermediate_size or name not in _DENSE_MLP}


class MixtralForCausalLM(LlamaForCausalLM):
    """Llama's embedding, attention, final norm, head and weight placement; routed experts
    for the MLP."""
    linear_shapes = staticmethod(linear_shapes)
    qk_norm = False  # per-head RMSNorm of q and k before RoPE (Qwen3)
    # Hugging Face names under "model.layers.<i>.": the router, and expert e's gate, up and down.
    hf_router = "block_sparse_moe.gate"
    hf_expert = "block_sparse_moe.experts.{e}.{part}"
    hf_expert_parts = ("w1", "w3", "w2")

    def __init__(self, args: MoeArgs, *, dtype=jnp.float32, linear_method=None, moe_method=None):
        """moe_method (layers/fused_moe.py; the platform's) runs the experts; default
        ragged_dot."""
        # Llama's embedding, final norm and head; the layers are this family's.
        super().__init__(dataclasses.replace(args, num_layers=0), dtype=dtype, linear_method=linear_method)
        self.args = args
        self.moe_method = moe_method or UnquantizedFusedMoEMethod()
        self.layers = nnx.List([nnx.Dict({
            name: nnx.Param((jnp.ones if name.endswith("norm") else jnp.zeros)(shape, dtype))
            for name, shape in self._layer_shapes().items()}) for _ in range(args.num_layers)])

    def _layer_shapes(self) -> dict[str, tuple[int, ...]]:
        a, method = self.args, self.linear_method
        shapes = {name: method.weight_shape(i, o) for name, (i, o) in self.linear_shapes(a).items()
                  if name != "lm_head"}
        shapes.update(input_layernorm=(a.hidden_size,), post_attention_layernorm=(a.hidden_size,),
                      router=(a.hidden_size, a.num_experts),
                      experts_gate_up=(a.num_experts, a.hidden_size, 2, a.moe_intermediate_size),
                      experts_down=(a.num_experts, a.moe_intermediate_size, a.hidden_size))
        if a.attention_bias:
            shapes["qkv_bias"] = llama.linear_shapes(a)["qkv_proj"][1]
        if a.intermediate_size:
            shapes["shared_expert_gate"] = (a.hidden_size, 1)
        if self.qk_norm:
            shapes.update(q_norm=(a.head_dim,), k_norm=(a.head_dim,))
        return shapes

    def mlp(self, num_tokens: jax.Array):
        return functools.partial(moe_block, self.args, self.linear_method.apply, self.moe_method,
                                 num_tokens=num_tokens)

    def load_hf_weights(self, weights: dict[str, np.ndarray], place=None) -> None:
        place = place or hf_weights.default_place
        named = [*self._attention_from_hf(weights), *self._experts_from_hf(weights)]
        self.load_weights((name, place(name, value)) for name, value in named)

    def load_weights(self, weights) -> None:
        """Llama's, the experts stored as the MoE method keeps them (quantized, with `quantization`)."""
        process = self.moe_method.process_weights_after_loading
        super().load_weights((name, process(value) if name.rsplit(".", 1)[-1] in _EXPERTS else value)
                             for name, value in weights)

    def _attention_from_hf(self, weights: dict[str, np.ndarray]):
        """Llama's loader for everything but the MLP (and the shared expert as Llama's MLP).
        Without a shared expert it is handed empty MLP tensors, whose results are dropped."""
        a = self.args
        view = dict(weights)
        for i in range(a.num_layers):
            p = f"model.layers.{i}.mlp."
            for part, empty in (("gate_proj", (0, a.hidden_size)), ("up_proj", (0, a.hidden_size)),
                                ("down_proj", (a.hidden_size, 0))):
                shared = weights.get(f"{p}shared_expert.{part}.weight")
                view[f"{p}{part}.weight"] = np.zeros(empty, np.float32) if shared is None else shared
        for name, value in llama._from_hf(self, view):
            if a.intermediate_size or name.rsplit(".", 1)[-1] not in _DENSE_MLP:
                yield name, value

    def _experts_from_hf(self, weights: dict[str, np.ndarray]):
        a = self.args
        dtype = self.embed_tokens.get_value().dtype
        E, H, I = a.num_experts, a.hidden_size, a.moe_intermediate_size

        def get(key, shape):
            if key not in weights:
                raise ValueError(f"Checkpoint is missing tensor {key!r}.")
            if weights[key].shape != shape:
                raise ValueError(f"Tensor {key!r} has shape {weights[key].shape}; the model config "
                                 f"needs {shape}.")
            return weights[key]

        for i in range(a.num_layers):
            p = f"model.layers.{i}."
            yield f"layers.{i}.router", get(f"{p}{self.hf_router}.weight", (E, H)).T.astype(dtype)
            gate, up, down = ([get(p + self.hf_expert.format(e=e, part=part) + ".weight", shape)
                               for e in range(E)]
                              for part, shape in zip(self.hf_expert_parts, ((I, H), (I, H), (H, I))))
            # fit: float experts in dtype, pre-quantized ones (QuantizedWeight) as stored.
            yield f"layers.{i}.experts_gate_up", hf_weights.fit(p + "experts_gate_up", np.stack(
                [np.stack([g.T, u.T], axis=1) for g, u in zip(gate, up)]), (E, H, 2, I), dtype)
            yield f"layers.{i}.experts_down", hf_weights.fit(p + "experts_down", np.stack([d.T for d in down]),
                                                             (E, I, H), dtype)
            if a.intermediate_size:
                yield f"layers.{i}.shared_expert_gate", get(f"{p}mlp.shared_expert_gate.weight",
                                                            (1, H)).T.astype(dtype)
            if self.qk_norm:
                for norm in ("q_norm", "k_norm"):
                    yield f"layers.{i}.{norm}", get(f"{p}self_attn.{norm}.weight",
                                                    (a.head_dim,)).astype(dtype)
