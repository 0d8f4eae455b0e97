"""KVSwapper: copies KV blocks between the device cache and a host (numpy) swap pool,
for swap preemption.

Both directions are jitted gathers/scatters over the block axis of every layer at once.
The number of blocks is padded to a power-of-two bucket so that only a handful of shapes
is ever compiled: padded gathers read the null block 0 (and are dropped), padded scatters
write into it, which no request ever reads.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxvllm.worker.model_runner_utils import make_buckets, pick_bucket


class KVSwapper:
    def __init__(self, kv_cache: jax.Array, num_slots: int, on_compile):
        L, two, num_blocks = kv_cache.shape[:3]
        # Slot-major, so one slot's data for every layer is one contiguous row.
        self.host = np.zeros((num_slots, L, two) + kv_cache.shape[3:], kv_cache.dtype)
        self.buckets = make_buckets(1, max(1, min(num_blocks - 1, num_slots)))

        def gather(kv, block_ids):
            on_compile()
            return jnp.moveaxis(kv[:, :, block_ids], 2, 0)

        def scatter(kv, block_ids, data):
            on_compile()
            return kv.at[:, :, block_ids].set(jnp.moveaxis(data, 0, 2))

        self._gather = jax.jit(gather)
        # The cache keeps its (tensor-parallel) sharding, so the step function's donation holds.
        self._scatter = jax.jit(scatter, donate_argnums=(0,), out_shardings=kv_cache.sharding)

    def _padded_ids(self, block_ids) -> np.ndarray:
        ids = np.zeros(pick_bucket(self.buckets, len(block_ids)), np.int32)
        ids[:len(block_ids)] = block_ids
        return ids

    def swap(self, kv_cache: jax.Array, swap_out: list[tuple[int, int]],
             swap_in: list[tuple[int, int]]) -> jax.Array:
        """Swap-outs first: a block freed by a swap-out may be the target of a swap-in or of
        this step's forward, and must be read before it is overwritten."""
        for start in range(0, len(swap_out), self.buckets[-1]):
            chunk = swap_out[start:start + self.buckets[-1]]
            data = np.asarray(self._gather(kv_cache, self._padded_ids([b for b, _ in chunk])))
            self.host[[s for _, s in chunk]] = data[:len(chunk)]
        for start in range(0, len(swap_in), self.buckets[-1]):
            chunk = swap_in[start:start + self.buckets[-1]]
            ids = self._padded_ids([b for _, b in chunk])
            data = np.zeros((len(ids),) + self.host.shape[1:], self.host.dtype)
            data[:len(chunk)] = self.host[[s for s, _ in chunk]]
            kv_cache = self._scatter(kv_cache, ids, data)
        return kv_cache

    def warmup(self, kv_cache: jax.Array) -> jax.Array:
        for n in self.buckets:
            ids = np.zeros(n, np.int32)
            self._gather(kv_cache, ids)
            kv_cache = self._scatter(kv_cache, ids, np.zeros((n,) + self.host.shape[1:], self.host.dtype))
        return kv_cache
