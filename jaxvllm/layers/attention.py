"""Paged attention for the model: write this step's K/V into the cache, then attend.

The kernel is the engine's backend's (jaxvllm/backends resolves `attention_backend` and
imports only the kernel it picks): `xla` (jax.numpy, jaxvllm/kernels/xla) runs anywhere;
`native` is the C++ CPU kernel (jaxvllm/kernels/cpu), which reads pages where they lie
instead of gathering copies; `pallas` is the Mosaic (TPU) or Triton (GPU) kernel
(pallas_kernels/), in interpret mode off its device, so either can be checked end to end on
a CPU.

A quantized cache (`kv_cache_dtype`, layers/kv_cache_dtype.py) is written quantized here and
read by the same kernels, which convert what they load to float: K's scale is folded into
the softmax scale and V's applied to the output, so no kernel knows the scales.
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from flax import struct
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from jaxvllm.distributed.logical_axes import HEADS, KV_HEADS, SEQUENCE, axis_rules, logical_to_mesh
from jaxvllm.distributed.partition import kv_cache_spec
from jaxvllm.layers.kv_cache_dtype import KVCacheDtype


@struct.dataclass
class AttentionMetadata:
    """Padded per-step arrays; only their shapes are compiled, never their values."""
    positions: jax.Array      # i32[num_tokens]
    # Per KV cache group (in_kv_cache_groups picks a layer's): [groups, ...]; the kernels
    # see one group's.
    slot_mapping: jax.Array   # i32[num_tokens]: page * block_size + offset; padding -> null block
    kv_lens: jax.Array        # i32[max_num_seqs]: context length after this step
    page_indices: jax.Array   # i32[max_num_seqs, max_pages_per_seq]: block tables
    cu_q_lens: jax.Array      # i32[max_num_seqs + 1]
    num_seqs: jax.Array       # i32[1]


def get_attention(impl: Callable, kv_layout: str = "portable", mesh: Mesh | None = None,
                  kv_dtype: KVCacheDtype | None = None) -> Callable:
    """The model's attention call over the kernel `impl` (the backend's: Backend.attention)
    and a KV cache in `kv_layout` (the platform's):
    attend(q, k, v, kv_cache, layer, md, sm_scale, sliding_window, soft_cap) -> (out, kv_cache)
    writes this step's K/V into their slots, then attends (soft_cap: Gemma 2's tanh cap on
    the scaled scores). layer and sliding_window may be traced (sliding_window: None, or the
    layer's window, <= 0 for none): a layer loop that runs one attention for every layer
    passes them as values, so no conditional ever stands between the cache and its update.

    On a mesh of several devices it runs per shard (shard_map over the KV-head axis): each
    device writes and reads only its own KV heads with its own query heads, the kernels see
    ordinary unsharded arrays, and no collective is needed inside attention.
    """
    def local(q, k, v, kv_cache, layer, md: AttentionMetadata, sm_scale, sliding_window=None,
              soft_cap=None):
        kv_cache = write_kv(kv_cache, layer, k, v, md.slot_mapping, kv_dtype, kv_layout)
        fmt = kv_dtype or KVCacheDtype(kv_cache.dtype)
        out = impl(q, kv_cache, layer, md.kv_lens, md.page_indices, md.cu_q_lens, md.num_seqs,
                   sm_scale=sm_scale * fmt.k_scale, sliding_window=sliding_window, soft_cap=soft_cap,
                   kv_dtype=fmt.kernel_kv_dtype)
        return (out * fmt.v_scale).astype(q.dtype) if fmt.v_scale != 1.0 else out, kv_cache

    if mesh is None or mesh.size == 1:
        return local

    rules = axis_rules(mesh.axis_names)
    q_heads, kv_heads = (logical_to_mesh((SEQUENCE, h, None), rules) for h in (HEADS, KV_HEADS))
    cache = kv_cache_spec(kv_layout, mesh.axis_names)

    def attend(q, k, v, kv_cache, layer, md: AttentionMetadata, sm_scale: float,
               sliding_window=None, soft_cap: float | None = None):
        def per_shard(q, k, v, kv_cache, layer, md, sliding_window):
            return local(q, k, v, kv_cache, layer, md, sm_scale, sliding_window, soft_cap)

        f = jax.shard_map(per_shard, mesh=mesh, in_specs=(q_heads, kv_heads, kv_heads, cache, P(), P(), P()),
                          out_specs=(q_heads, cache), check_vma=False)
        return f(q, k, v, kv_cache, layer, md, sliding_window)
    return attend


def in_kv_cache_groups(attend: Callable, layer_groups: tuple[int, ...] | None = None,
                       layer_slots: tuple[int, ...] | None = None) -> Callable:
    """The attention a model calls, over a cache whose layers keep their pages in KV cache
    groups (core/kv_cache_interface.py): layer i reads and writes its group's block tables
    (md's [groups, ...] arrays) in its slot of the cache. None: one group, slot = layer.
    An int layer (the unrolled loop) picks both statically, a traced one by indexing."""
    def grouped(q, k, v, kv_cache, layer, md: AttentionMetadata, *args, **kwargs):
        if layer_groups is None:
            group, slot = 0, layer
        elif isinstance(layer, int):
            group, slot = layer_groups[layer], layer_slots[layer]
        else:
            group = jnp.asarray(layer_groups, jnp.int32)[layer]
            slot = jnp.asarray(layer_slots, jnp.int32)[layer]
        md = md.replace(slot_mapping=md.slot_mapping[group], page_indices=md.page_indices[group])
        return attend(q, k, v, kv_cache, slot, md, *args, **kwargs)
    return grouped


def write_kv(kv_cache: jax.Array, layer: jax.Array, k: jax.Array, v: jax.Array, slot_mapping: jax.Array,
             kv_dtype: KVCacheDtype | None = None, kv_layout: str = "portable") -> jax.Array:
    """kv_cache: [layers, 2, pages, page_size, kv_heads, head_dim], or the TPU's [layers, 2,
    pages, page_size / 8, 8, kv_heads * lanes] (the backend's kv_cache_shape), updated in
    place; k and v stored as kv_dtype says (default: cast to the cache's dtype)."""
    fmt = kv_dtype or KVCacheDtype(kv_cache.dtype)
    kv = jnp.stack([fmt.quantize(k, fmt.k_scale), fmt.quantize(v, fmt.v_scale)])  # [2, tokens, kv_heads, head_dim]
    # K/V is indexed, not a window of the update: a TPU then writes each slot's row where
    # the cache's own layout keeps it (a window over K/V had XLA relayout the whole pool).
    which = jnp.arange(2, dtype=jnp.int32)[:, None]
    if kv_layout == "tpu":  # heads along lanes, each padded to kv_cache's lanes per head
        rows_per_tile = kv_cache.shape[4]
        page_size, lanes = kv_cache.shape[3] * rows_per_tile, kv_cache.shape[5] // kv.shape[2]
        kv = jnp.pad(kv, ((0, 0),) * 3 + ((0, lanes - kv.shape[3]),)).reshape(kv.shape[:2] + (-1,))
        row = slot_mapping % page_size
        return kv_cache.at[layer, which, (slot_mapping // page_size)[None], (row // rows_per_tile)[None],
                           (row % rows_per_tile)[None]].set(kv)
    page_size = kv_cache.shape[3]
    return kv_cache.at[layer, which, (slot_mapping // page_size)[None], (slot_mapping % page_size)[None]].set(kv)
