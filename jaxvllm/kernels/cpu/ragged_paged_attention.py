"""Ragged paged attention on the CPU through the native kernel (ragged_paged_attention.cc).

Same arguments and result as jaxvllm/kernels/xla/ragged_paged_attention.py (the sliding window
may be traced: an operand of the kernel, <= 0 for none). The kernel reads float32 caches and
bfloat16 ones stored as their bits (uint16, kv_dtype=bfloat16: how the CPU platform keeps them),
both in float32 arithmetic; a quantized cache (int8, fp8) or a float16 one goes to the XLA kernel.
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
    if kv_cache.dtype == jnp.float32:
        target = "jaxvllm_ragged_paged_attention"
    elif kv_cache.dtype == jnp.uint16 and kv_dtype == jnp.bfloat16:
        target = "jaxvllm_ragged_paged_attention_bf16_bits"
    else:
        return xla.ragged_paged_attention(q, kv_cache, layer, kv_lens, page_indices, cu_q_lens,
                                                num_seqs, sm_scale=sm_scale, sliding_window=sliding_window,
                                                soft_cap=soft_cap, kv_dtype=kv_dtype)
    build.load()
    call = jax.ffi.ffi_call(target, jax.ShapeDtypeStruct(q.shape, jnp.float32))
    i32 = lambda x: jnp.asarray(x, jnp.int32)
    out = call(q.astype(jnp.float32), kv_cache, i32(layer).reshape(()), i32(kv_lens), i32(page_indices),
               i32(cu_q_lens), i32(num_seqs), i32(0 if sliding_window is None else sliding_window).reshape(()),
               sm_scale=np.float32(sm_scale), soft_cap=np.float32(soft_cap or 0.0))
    return out.astype(q.dtype)
