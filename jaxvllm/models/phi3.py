"""Phi-3: the Llama decoder, whose checkpoint stores q/k/v as one `qkv_proj` and gate/up as
one `gate_up_proj`; they are split into Llama's names on load, then fused Llama's way."""
from __future__ import annotations

import dataclasses

import numpy as np

from jaxvllm.models import hf_weights
from jaxvllm.models.llama import LlamaArgs, LlamaForCausalLM


@dataclasses.dataclass(frozen=True)
class Phi3Args(LlamaArgs):
    @classmethod
    def from_hf_config(cls, cfg) -> "Phi3Args":
        rope = dict(getattr(cfg, "rope_parameters", None) or {})
        if rope.get("partial_rotary_factor", 1.0) != 1.0:
            raise ValueError(f"Phi-3 with partial_rotary_factor={rope['partial_rotary_factor']} is not supported.")
        if rope.get("rope_type", "default") != "default":
            raise ValueError(f"Phi-3 with rope_type {rope['rope_type']!r} is not supported (default only).")
        return super().from_hf_config(cfg)


class Phi3ForCausalLM(LlamaForCausalLM):
    def load_hf_weights(self, weights: dict[str, np.ndarray], place=None) -> None:
        super().load_hf_weights(split_fused(self.args, weights), place)


def split_fused(a: LlamaArgs, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Phi-3's fused tensors as Llama's q/k/v and gate/up ([out, in], views: no copies). The
    args' heads may be padded for tensor parallelism, the checkpoint's are not: the split
    follows the checkpoint's rows, in groups of (query heads per KV head + 2) heads."""
    out = dict(weights)
    group = a.num_heads // a.num_kv_heads
    for i in range(a.num_layers):
        p = f"model.layers.{i}."
        qkv = hf_weights.get(out, key := p + "self_attn.qkv_proj.weight")
        if qkv.shape[0] % ((group + 2) * a.head_dim):
            raise ValueError(f"Tensor {key!r} of shape {qkv.shape} does not fit the model config "
                             f"(groups of {group} query heads, a K and a V head of {a.head_dim}).")
        kv_rows = qkv.shape[0] // (group + 2)
        q_rows = group * kv_rows
        del out[key]
        for name, rows in zip("qkv", np.split(qkv, [q_rows, q_rows + kv_rows])):
            out[f"{p}self_attn.{name}_proj.weight"] = rows
        gate_up = hf_weights.get(out, key := p + "mlp.gate_up_proj.weight")
        if gate_up.shape[0] != 2 * a.intermediate_size:
            raise ValueError(f"Tensor {key!r} of shape {gate_up.shape} does not fit the model config "
                             f"(2 x {a.intermediate_size} rows).")
        del out[key]
        out[p + "mlp.gate_proj.weight"], out[p + "mlp.up_proj.weight"] = np.split(gate_up, 2)
    return out
