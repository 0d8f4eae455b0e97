"""Placement of weights on the mesh by their logical axes, and the paged KV cache's.

Each family declares its weights' logical axes (models/weight_spec.py); the mesh layout's
table (logical_axes.py) makes them Megatron-style tensor parallelism over the "model" axis:
- the fused q/k/v projection and the MLP's fused gate/up are column parallel (split on
  their KV-head and intermediate-feature axes, so each device owns whole groups of
  attention heads and a slice of the intermediate features, both halves of it);
- o_proj and down_proj are row parallel (input features split; XLA all-reduces their outputs);
- the embedding and the LM head are vocabulary parallel; experts are split on their
  intermediate features, or whole per device under expert parallelism;
- the KV cache is split on its KV-head axis, so each device's attention reads only its heads.
A dimension that does not divide by the mesh size is replicated instead of split (a vocabulary
of 32001, say). Attention heads are padded instead (`padded_heads`), since attention needs a
device's query heads and their KV heads side by side.
"""
from __future__ import annotations

import math

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxvllm.distributed.logical_axes import EXPERTS, KV_HEADS, axis_rules, logical_to_mesh
from jaxvllm.transformers_utils.quantized_weight import QuantizedWeight


def padded_heads(num_heads: int, num_kv_heads: int, tp: int) -> tuple[int, int]:
    """(query heads, KV heads) after padding the KV heads to a multiple of `tp` with zero
    heads, each bringing its group of zero query heads: query head j keeps attending KV head
    j // group, so every device holds whole groups. Padded heads contribute exactly zero
    (zero o_proj rows). The default model's 3 KV / 9 query heads become 4 / 12 at TP=2 or 4."""
    if num_heads % num_kv_heads:
        raise ValueError(f"num_attention_heads ({num_heads}) must be a multiple of "
                         f"num_key_value_heads ({num_kv_heads}).")
    if num_kv_heads % tp == 0:
        return num_heads, num_kv_heads
    kv = math.ceil(num_kv_heads / tp) * tp
    return kv * (num_heads // num_kv_heads), kv


def fit_spec(spec: tuple, shape: tuple[int, ...], mesh: Mesh) -> P:
    """The spec, with any split dimension that does not divide by its mesh axis replicated."""
    return P(*(None if axis is not None and dim % mesh.shape[axis] else axis
               for axis, dim in zip(spec, shape)))


def param_sharding(weight, shape: tuple[int, ...], mesh: Mesh, expert_parallel: bool = False) -> NamedSharding:
    """weight: its family's declaration (models/weight_spec.Weight); shape: as stored.
    Under expert parallelism a stack of experts is split on its experts axis alone, which
    must divide."""
    spec = logical_to_mesh(weight.axes, axis_rules(mesh.axis_names, expert_parallel))
    if expert_parallel and EXPERTS in weight.axes:
        experts, axis = shape[weight.axes.index(EXPERTS)], spec[weight.axes.index(EXPERTS)]
        if experts % mesh.shape[axis]:
            raise ValueError(f"enable_expert_parallel: the model's {experts} experts do not divide "
                             f"over tensor_parallel_size={mesh.shape[axis]} devices.")
        return NamedSharding(mesh, spec)
    return NamedSharding(mesh, fit_spec(spec, shape, mesh))


def kv_cache_spec(layout: str, mesh_axes: tuple[str, ...]) -> P:
    """The KV cache split by KV heads (Backend.kv_cache_shape): the fifth axis of the
    portable [layers, K/V, pages, page_size, kv_heads, head_dim], the sixth (heads x lanes)
    of the TPU's [layers, K/V, pages, page_size / 8, 8, kv_heads * lanes]."""
    axes = (None,) * (5 if layout == "tpu" else 4) + (KV_HEADS,)
    return logical_to_mesh(axes, axis_rules(mesh_axes))


def kv_cache_sharding(mesh: Mesh, layout: str) -> NamedSharding:
    return NamedSharding(mesh, kv_cache_spec(layout, mesh.axis_names))


def place(mesh: Mesh, weight, value: np.ndarray, expert_parallel: bool = False) -> jax.Array:
    """A host array put onto the mesh shard by shard: each device receives only its slice
    (and each process supplies only its own devices' slices), so no device ever holds a
    whole tensor that is meant to be split. A pre-quantized weight becomes a QArray whose
    values and scales are split alike (a scale axis of size 1 is replicated)."""
    if isinstance(value, QuantizedWeight):
        return value.to_qarray(lambda part: place(mesh, weight, part, expert_parallel))
    sharding = param_sharding(weight, value.shape, mesh, expert_parallel)
    return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])


def param_name(path) -> str:
    """'layers.0.qkv_proj' for a jax tree path into the model's params (State or pure dict)."""
    keys = [str(getattr(k, "key", getattr(k, "name", k))) for k in path]
    keys = [k for k in keys if k != "value"]  # nnx.Variable's own field
    return ".".join(keys)
