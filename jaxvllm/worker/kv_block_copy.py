"""KVBlockCopier: copies whole KV blocks (a page of every slot of the cache) between the
device cache and host rows, for swap preemption (worker/kv_swap.py) and the offload
connector's host tier (kv_transfer/offloading_connector.py).

Both directions are jitted gathers/scatters over the block axis of every slot at once.
The number of blocks is padded to a power-of-two bucket so that only a handful of shapes
is ever compiled: padded gathers read the null block 0 (and are dropped), padded scatters
write into it, which no request ever reads.
"""
from __future__ import annotations

import logging
import os

import jax
import jax.numpy as jnp
import numpy as np

from jaxvllm.worker.model_runner_utils import make_buckets, pick_bucket

logger = logging.getLogger(__name__)
# vLLM's limits for its swap space, as shares of the host's memory: past the first a
# warning, past the second a refusal.
HOST_WARN_SHARE, HOST_MAX_SHARE = 0.4, 0.7


class KVBlockCopier:
    def __init__(self, kv_cache: jax.Array, max_blocks: int, on_compile):
        """max_blocks: the most blocks one call moves (more are cut into calls of that many)."""
        L, two, num_blocks = kv_cache.shape[:3]
        # Block-major rows, so one block's data for every slot is one contiguous row.
        self.row_shape = (L, two) + kv_cache.shape[3:]
        self.dtype = kv_cache.dtype
        self.buckets = make_buckets(1, max(1, min(num_blocks - 1, max_blocks)))

        def gather(kv, block_ids):
            on_compile()
            return jnp.moveaxis(kv[:, :, block_ids], 2, 0)

        def scatter(kv, block_ids, data):
            on_compile()
            return kv.at[:, :, block_ids].set(jnp.moveaxis(data, 0, 2))

        self._gather = jax.jit(gather)
        # The cache keeps its (tensor-parallel) sharding, so the step function's donation holds.
        self._scatter = jax.jit(scatter, donate_argnums=(0,), out_shardings=kv_cache.sharding)

    @property
    def row_bytes(self) -> int:
        return int(np.prod(self.row_shape)) * np.dtype(self.dtype).itemsize

    def padded_len(self, num_blocks: int) -> int:
        """The bucket a call moving num_blocks blocks is padded to."""
        return pick_bucket(self.buckets, num_blocks)

    def _padded_ids(self, block_ids) -> np.ndarray:
        ids = np.zeros(pick_bucket(self.buckets, len(block_ids)), np.int32)
        ids[:len(block_ids)] = block_ids
        return ids

    def chunks(self, items: list) -> list[list]:
        """items cut into calls of at most the largest bucket."""
        step = self.buckets[-1]
        return [items[i:i + step] for i in range(0, len(items), step)]

    def gather(self, kv_cache: jax.Array, block_ids: list[int]) -> jax.Array:
        """The blocks' rows, still on device, padded to a bucket (at most the largest)."""
        return self._gather(kv_cache, self._padded_ids(block_ids))

    def scatter(self, kv_cache: jax.Array, block_ids: list[int], rows: np.ndarray) -> jax.Array:
        """Write host rows (one per block id, at most the largest bucket) into the blocks."""
        ids = self._padded_ids(block_ids)
        data = np.zeros((len(ids),) + self.row_shape, self.dtype)
        data[:len(block_ids)] = rows
        return self._scatter(kv_cache, ids, data)

    def scatter_rows(self, kv_cache: jax.Array, block_ids: list[int], rows: jax.Array) -> jax.Array:
        """Write rows already on device, padded to the bucket of len(block_ids) (a gather's
        output, here or on another engine), into the blocks."""
        return self._scatter(kv_cache, self._padded_ids(block_ids), rows)

    def warmup(self, kv_cache: jax.Array) -> jax.Array:
        for n in self.buckets:
            ids = np.zeros(n, np.int32)
            self._gather(kv_cache, ids)
            kv_cache = self._scatter(kv_cache, ids, np.zeros((n,) + self.row_shape, self.dtype))
        return kv_cache


def total_host_memory() -> int:
    """The host's memory, or the container's limit where that is lower (cgroup v2)."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
    except OSError:
        return total
    return min(total, int(limit)) if limit.isdigit() else total


def host_rows(copier: KVBlockCopier, num_blocks: int, setting: str) -> np.ndarray:
    """Host rows for num_blocks blocks, refused by the setting's name past HOST_MAX_SHARE of
    the host's memory: np.zeros only reserves address space, so a pool too big would start
    and be killed by the kernel once it filled, mid-serving."""
    need, total = num_blocks * copier.row_bytes, total_host_memory()
    what = f"{setting}: {num_blocks} host blocks take {need / 2**30:.2f} GiB of the host's {total / 2**30:.2f} GiB"
    if need > HOST_MAX_SHARE * total:
        raise ValueError(f"{what}, more than {HOST_MAX_SHARE:.0%} of it; lower {setting}.")
    if need > HOST_WARN_SHARE * total:
        logger.warning("%s (over %.0f%% of it).", what, 100 * HOST_WARN_SHARE)
    return np.zeros((num_blocks,) + copier.row_shape, copier.dtype)
