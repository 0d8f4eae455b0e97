"""Ragged paged attention on the CPU through the native kernel (ragged_paged_attention.cc).

Same arguments and result as jaxvllm/kernels/xla/ragged_paged_attention.py (the sliding window
may be traced: an operand of the kernel, <= 0 for none). The kernel reads
float32 caches; any other dtype (bfloat16, or a quantized int8 / fp8 cache) goes to the XLA
kernel.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxvllm.kernels.cpu import build
from jaxvllm.kernels.xla import ragged_paged_attention as xla


def ragged_paged_attention(q, kv_cache, layer, kv_lens, page_indices, cu_q_lens, num_seqs, *,
                           sm_scale: float, sliding_window: int | jax.Array | None = None,
                           soft_cap: float | None = None, kv_dtype=None) -> jax.Array:
    if kv_cache.dtype != jnp.float32:
        return xla.ragged_paged_attention(q, kv_cache, layer, kv_lens, page_indices, cu_q_lens,
                                                num_seqs, sm_scale=sm_scale, sliding_window=sliding_window,
                                                soft_cap=soft_cap, kv_dtype=kv_dtype)
    build.load()
    call = jax.ffi.ffi_call("jaxvllm_ragged_paged_attention", jax.ShapeDtypeStruct(q.shape, jnp.float32))
    i32 = lambda x: jnp.asarray(x, jnp.int32)
    out = call(q.astype(jnp.float32), kv_cache, i32(layer).reshape(()), i32(kv_lens), i32(page_indices),
               i32(cu_q_lens), i32(num_seqs), i32(0 if sliding_window is None else sliding_window).reshape(()),
               sm_scale=np.float32(sm_scale), soft_cap=np.float32(soft_cap or 0.0))
    return out.astype(q.dtype)
