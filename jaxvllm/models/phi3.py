"""Phi-3: the Llama decoder, whose checkpoint stores q/k/v as one `qkv_proj` and gate/up as
one `gate_up_proj`: its weight spec splits them and fuses them Llama's way."""
from __future__ import annotations

import dataclasses
import functools

import numpy as np

from jaxvllm.models import llama
from jaxvllm.models.llama import LlamaArgs, LlamaForCausalLM
from jaxvllm.models.weight_spec import Weight, linear


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


def split_qkv(a: LlamaArgs, key: str, qkv):
    """Phi-3's [q; k; v] rows ([out, in], views: no copies) fused Llama's way. The args' heads
    may be padded for tensor parallelism, the checkpoint's are not: the split follows the
    checkpoint's rows, in groups of (query heads per KV head + 2) heads."""
    group = a.num_heads // a.num_kv_heads
    if qkv.shape[0] % ((group + 2) * a.head_dim):
        raise ValueError(f"Tensor {key!r} of shape {qkv.shape} does not fit the model config "
                         f"(groups of {group} query heads, a K and a V head of {a.head_dim}).")
    kv_rows = qkv.shape[0] // (group + 2)
    q, k, v = np.split(qkv, [group * kv_rows, (group + 1) * kv_rows])
    return llama.fuse_qkv_weight(a, key, q, k, v)


def split_gate_up(a: LlamaArgs, key: str, gate_up):
    if gate_up.shape[0] != 2 * a.intermediate_size:
        raise ValueError(f"Tensor {key!r} of shape {gate_up.shape} does not fit the model config "
                         f"(2 x {a.intermediate_size} rows).")
    return np.stack([part.T for part in np.split(gate_up, 2)], axis=1)


def weight_spec(a: Phi3Args) -> list[Weight]:
    p = "model.layers.{i}."
    fused = {"layers.{i}.qkv_proj": (p + "self_attn.qkv_proj.weight", split_qkv),
             "layers.{i}.gate_up_proj": (p + "mlp.gate_up_proj.weight", split_gate_up)}
    return [linear(w.path, w.shape[0], w.shape[1:], w.axes, [fused[w.path][0]],
                   functools.partial(fused[w.path][1], a)) if w.path in fused else w
            for w in llama.weight_spec(a)]


class Phi3ForCausalLM(LlamaForCausalLM):
    weight_spec = staticmethod(weight_spec)
