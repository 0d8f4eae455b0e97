"""This machine's limits, measured in the same run as the benchmark that divides by them:
dense float32 matmul FLOP/s and memory copy bandwidth, both through XLA."""
from __future__ import annotations

import time

import jax
import jax.numpy as jnp


def _best_time(fn, *args, repeats: int = 5) -> float:
    jax.block_until_ready(fn(*args))  # compile and warm
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - start)
    return best


def matmul_flops(n: int = 2048) -> float:
    """Peak-like float32 FLOP/s from one large square matmul (best of several)."""
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
    return 2 * n**3 / _best_time(jax.jit(jnp.matmul), a, b)


def memory_bandwidth(num_bytes: int = 256 << 20) -> float:
    """Bytes/s moved by an out-of-place copy (read + write) of a large float32 array."""
    x = jnp.ones(num_bytes // 4, jnp.float32)
    return 2 * num_bytes / _best_time(jax.jit(lambda v: v * 1.0000001), x)


def llama_flops_per_token(hf_config, context_len: float) -> float:
    """Forward FLOPs of one token: 2 x matmul parameters (LM head included) plus attention
    over `context_len` cached positions (QK^T and PV)."""
    c = hf_config
    hd = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    q, kv = c.num_attention_heads * hd, c.num_key_value_heads * hd
    per_layer = c.hidden_size * (2 * q + 2 * kv) + 3 * c.hidden_size * c.intermediate_size
    matmul_params = c.num_hidden_layers * per_layer + c.vocab_size * c.hidden_size
    attention = 4 * c.num_hidden_layers * q * context_len
    return 2 * matmul_params + attention
