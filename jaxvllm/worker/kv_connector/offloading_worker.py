"""OffloadingConnector, worker side: the host tier's bytes and the copies to and from it
(the scheduler side, which decides them, is offloading_connector.py).

Saves go through a fixed set of staging blocks: the evicted pages are gathered on device
into a staging buffer before the step's forward can overwrite them, its copy to the host
starts at once (`copy_to_host_async`), and it lands in the host array later, when it is
done (checked after each forward) or when the staging set is full or a load needs that
slot; so a step waits for a save only when `num_staging_blocks` are still in flight.
Loads read the host rows and write them into the new pages before the forward, in device
order. The counters are vLLM's (`{transfer_type}_total_bytes` / `_total_time`, the time
being what the host spent on them).
"""
from __future__ import annotations

import time
from collections import deque

import jax
import numpy as np

from jaxvllm import platforms
from jaxvllm.kv_transfer.base import KVConnectorBase_V1
from jaxvllm.kv_transfer.offloading_connector import OffloadingConnectorMetadata, num_cpu_blocks
from jaxvllm.worker.kv_block_copy import KVBlockCopier, host_rows

DEFAULT_STAGING_BLOCKS = 32


class OffloadingConnectorWorker(KVConnectorBase_V1):
    metadata_cls = OffloadingConnectorMetadata
    def __init__(self, config, role, kv_cache_config):
        super().__init__(config, role, kv_cache_config)
        extra = config.kv_transfer.kv_connector_extra_config
        self.num_cpu_blocks = num_cpu_blocks(extra, kv_cache_config.block_bytes)
        self.num_staging_blocks = extra.get("num_staging_blocks", DEFAULT_STAGING_BLOCKS)
        # vLLM names the device medium GPU; on the CPU platform the "device" is XLA's buffers.
        device = {"cuda": "GPU", "tpu": "TPU"}.get(platforms.current_platform.device_name, "DEVICE")
        self.save_type, self.load_type = f"{device}_to_CPU", f"CPU_to_{device}"
        self.stats = {f"{t}_total_{k}": 0 for t in (self.save_type, self.load_type) for k in ("bytes", "time")}
        self._staged: deque[tuple[jax.Array, list[int]]] = deque()  # FIFO: a slot's last save lands last
        self._pending: dict[int, tuple] = {}  # host slot -> the staged save it waits for
        self._num_staged = 0

    @classmethod
    def reserved_device_bytes(cls, config, block_bytes: int) -> int:
        """The staging buffers: up to num_staging_blocks gathered pages in flight."""
        extra = config.kv_transfer.kv_connector_extra_config
        return extra.get("num_staging_blocks", DEFAULT_STAGING_BLOCKS) * block_bytes

    def register_kv_caches(self, kv_cache: jax.Array, on_compile) -> None:
        self.copier = KVBlockCopier(kv_cache, self.num_staging_blocks, on_compile)
        extra = self.config.kv_transfer.kv_connector_extra_config
        setting = "num_cpu_blocks" if "num_cpu_blocks" in extra else "cpu_bytes_to_use"
        self.host = host_rows(self.copier, self.num_cpu_blocks, f"kv_connector_extra_config.{setting}")

    def warmup(self, kv_cache: jax.Array) -> jax.Array:
        return self.copier.warmup(kv_cache)

    def start_load_kv(self, kv_cache: jax.Array) -> jax.Array:
        """This step's saves (gathered before anything writes their pages: they may be this
        step's new pages, loads' targets included), then its loads."""
        meta, copier = self._metadata, self.copier
        if meta is None:
            return kv_cache
        for chunk in copier.chunks(meta.saves):
            staged = copier.gather(kv_cache, [b for b, _ in chunk])
            staged.copy_to_host_async()
            entry = (staged, [s for _, s in chunk])
            self._staged.append(entry)
            self._pending.update((s, entry) for _, s in chunk)
            self._num_staged += len(chunk)
            while self._num_staged > self.num_staging_blocks:
                self._land()
        for chunk in copier.chunks(meta.loads):
            start = time.perf_counter()
            slots = [s for s, _ in chunk]
            while any(s in self._pending for s in slots):  # its save is still staged
                self._land()
            kv_cache = copier.scatter(kv_cache, [b for _, b in chunk], self.host[slots])
            self._count(self.load_type, len(chunk), time.perf_counter() - start)
        return kv_cache

    def wait_for_save(self, kv_cache: jax.Array) -> None:
        """Land the staged saves whose copies are done, without waiting for the others."""
        while self._staged and self._staged[0][0].is_ready():
            self._land()

    def _land(self) -> None:
        """Write the oldest staged save into its host slots (waiting for its copy)."""
        start = time.perf_counter()
        staged, slots = entry = self._staged.popleft()
        self.host[slots] = np.asarray(staged)[:len(slots)]
        for s in slots:
            if self._pending.get(s) is entry:
                del self._pending[s]
        self._num_staged -= len(slots)
        self._count(self.save_type, len(slots), time.perf_counter() - start)

    def _count(self, transfer_type: str, num_blocks: int, seconds: float) -> None:
        self.stats[f"{transfer_type}_total_bytes"] += num_blocks * self.copier.row_bytes
        self.stats[f"{transfer_type}_total_time"] += seconds

    def get_kv_connector_stats(self) -> dict[str, float]:
        return dict(self.stats)
