"""Rotary position embedding (rotate-half form, as Hugging Face Llama applies it).

Inverse frequencies are computed once on the host, with the Llama-3 and linear
scalings; the device does cos/sin of positions times these once per step
(`rotary_cos_sin`, vLLM's cos_sin_cache in effect), and every layer rotates with them.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np


def compute_inv_freq(head_dim: int, rope_theta: float, rope_scaling: dict | None) -> np.ndarray:
    inv_freq = 1.0 / (rope_theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    rope_type = (rope_scaling or {}).get("rope_type", (rope_scaling or {}).get("type", "default"))
    if rope_type == "default":
        pass
    elif rope_type == "linear":
        inv_freq = inv_freq / rope_scaling["factor"]
    elif rope_type == "llama3":
        factor = rope_scaling["factor"]
        low, high = rope_scaling["low_freq_factor"], rope_scaling["high_freq_factor"]
        old_len = rope_scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        scaled = np.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        is_medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
        inv_freq = np.where(is_medium, smoothed, scaled)
    else:
        raise ValueError(f"rope_scaling type {rope_type!r} is not supported "
                         "(supported: default, linear, llama3).")
    return inv_freq.astype(np.float32)


def rotary_cos_sin(positions: jax.Array, inv_freq: jax.Array) -> tuple[jax.Array, jax.Array]:
    """cos and sin of each position times the inverse frequencies, [tokens, 1, head_dim / 2]
    each: computed once for all layers (inside a layer, XLA:CPU fused them into the rotation
    and computed them again for every element of q and k)."""
    freqs = positions.astype(jnp.float32)[:, None] * inv_freq[None, :]
    return jnp.cos(freqs)[:, None, :], jnp.sin(freqs)[:, None, :]


def apply_rotary(x: jax.Array, cos_sin: tuple[jax.Array, jax.Array]) -> jax.Array:
    """x: [tokens, heads, head_dim]; cos_sin: `rotary_cos_sin` of its positions."""
    cos, sin = cos_sin
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)
