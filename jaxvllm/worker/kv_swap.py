"""KVSwapper: copies KV blocks between the device cache and a host (numpy) swap pool, for
swap preemption (the copies themselves: worker/kv_block_copy.py)."""
from __future__ import annotations

import jax
import numpy as np

from jaxvllm.worker.kv_block_copy import KVBlockCopier, host_rows


class KVSwapper:
    def __init__(self, kv_cache: jax.Array, num_slots: int, on_compile):
        self.copier = KVBlockCopier(kv_cache, num_slots, on_compile)
        self.host = host_rows(self.copier, num_slots, "swap_space")

    def swap(self, kv_cache: jax.Array, swap_out: list[tuple[int, int]],
             swap_in: list[tuple[int, int]]) -> jax.Array:
        """Swap-outs first: a block freed by a swap-out may be the target of a swap-in or of
        this step's forward, and must be read before it is overwritten."""
        copier = self.copier
        for chunk in copier.chunks(swap_out):
            data = np.asarray(copier.gather(kv_cache, [b for b, _ in chunk]))
            self.host[[s for _, s in chunk]] = data[:len(chunk)]
        for chunk in copier.chunks(swap_in):
            kv_cache = copier.scatter(kv_cache, [b for _, b in chunk], self.host[[s for s, _ in chunk]])
        return kv_cache

    def warmup(self, kv_cache: jax.Array) -> jax.Array:
        return self.copier.warmup(kv_cache)
