"""OffloadingConnector, scheduler side: a host-memory tier under the prefix cache (vLLM's
OffloadingConnector; `kv_connector_extra_config`: `num_cpu_blocks` or `cpu_bytes_to_use`).

A cached block that the pool evicts (to reuse its page) is not lost: its KV is copied to a
host slot, kept in an LRU of `num_cpu_blocks` slots under the prefix cache's own key (the
block's chained hash and its KV cache group), so salts, adapters and models stay apart as
they do on the device. A waiting request whose prefix continues past the device's hit in
that LRU loads those blocks from host memory into freshly allocated pages instead of
computing them. Finished requests' blocks stay in the device prefix cache and reach the
host when they are evicted in turn.

The copies themselves are the worker side's (offloading_worker.py): a save is gathered
before the step that reuses the page writes it, a load is written before the step's
forward, both in device order with the forward.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from jaxvllm.kv_transfer.base import KVConnectorBase_V1
from jaxvllm.outputs import KVConnectorOutput


@dataclass
class OffloadingConnectorMetadata:
    # (device block id, host slot): blocks evicted this step, copied out before it writes them.
    saves: list[tuple[int, int]] = field(default_factory=list)
    # (host slot, device block id): host hits copied into a request's new pages.
    loads: list[tuple[int, int]] = field(default_factory=list)


def num_cpu_blocks(extra_config: dict, block_bytes: int) -> int:
    """The host tier's slots: num_cpu_blocks, or cpu_bytes_to_use / bytes per block."""
    if "num_cpu_blocks" in extra_config:
        return extra_config["num_cpu_blocks"]
    return extra_config["cpu_bytes_to_use"] // block_bytes


class OffloadingConnectorScheduler(KVConnectorBase_V1):
    def __init__(self, config, role, kv_cache_config, kv_cache_manager, use_eagle: bool = False):
        super().__init__(config, role, kv_cache_config)
        self.block_size = kv_cache_config.block_size
        self.num_groups = len(kv_cache_config.kv_cache_groups)
        self.use_eagle = use_eagle
        n = num_cpu_blocks(config.kv_transfer.kv_connector_extra_config, kv_cache_config.block_bytes)
        self.num_cpu_blocks = n
        self.slots: OrderedDict[tuple, int] = OrderedDict()  # (BlockHash, group) -> host slot, LRU first
        self._free_slots = list(range(n - 1, -1, -1))
        self._pinned: set[int] = set()  # slots this step loads from: no save may reuse them
        self._matched: dict[str, int] = {}  # request -> first block of its host hit
        self._loads: list[tuple[int, int]] = []
        # The pool reports every cached block it evicts (device block id, hash, group).
        self._evictions = kv_cache_manager.block_pool.evictions = []
        self.queries = self.hits = self.stored_blocks = 0
        self.worker_stats: dict[str, float] = {}

    # ---- a waiting request's host hit ------------------------------------------------
    def get_num_new_matched_tokens(self, request, num_computed_tokens: int) -> tuple[int, bool]:
        """Whole blocks right after the device's hit whose every group's pages are on the host.
        Never the request's last token (it is computed, for its logits), and with EAGLE-3
        not the last block of the hit (its head's KV there depends on the next token)."""
        bs, hashes = self.block_size, request.block_hashes
        start = num_computed_tokens // bs
        end = min(len(hashes), (request.num_tokens - 1) // bs)
        n = 0
        while start + n < end and all((hashes[start + n], g) in self.slots for g in range(self.num_groups)):
            n += 1
        if self.use_eagle and n:
            n -= 1
        if n:
            self._matched[request.request_id] = start
        return n * bs, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        """blocks: the request's tables after allocation; the matched blocks' pages load."""
        start = self._matched.pop(request.request_id, None)
        self.queries += request.num_tokens
        if not num_external_tokens or start is None:
            return
        self.hits += num_external_tokens
        for i in range(start, start + num_external_tokens // self.block_size):
            for g in range(self.num_groups):
                key = (request.block_hashes[i], g)
                slot = self.slots[key]
                self.slots.move_to_end(key)
                self._pinned.add(slot)
                self._loads.append((slot, blocks.blocks[g][i].block_id))

    # ---- the step's orders -------------------------------------------------------------
    def build_connector_meta(self, scheduler_output) -> OffloadingConnectorMetadata:
        """Saves for the blocks this step's allocations evicted that the host lacks, each in
        the least recently used slot no load of this step reads."""
        saves = []
        for block_id, block_hash, group in self._evictions:
            key = (block_hash, group)
            if key in self.slots:
                self.slots.move_to_end(key)
                continue
            slot = self._take_slot()
            if slot is None:
                break  # every slot is read by this step's loads
            self.slots[key] = slot
            saves.append((block_id, slot))
        self.stored_blocks += len(saves)
        self._evictions.clear()
        meta = OffloadingConnectorMetadata(saves, self._loads)
        self._loads, self._pinned = [], set()
        return meta

    def _take_slot(self) -> int | None:
        if self._free_slots:
            return self._free_slots.pop()
        for key, slot in self.slots.items():
            if slot not in self._pinned:
                del self.slots[key]
                return slot
        return None

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        self.worker_stats = connector_output.kv_connector_stats

    def request_finished(self, request, block_ids) -> tuple[bool, dict | None]:
        """Its pages go back at once: they stay cached on the device until evicted."""
        self._matched.pop(request.request_id, None)
        return False, None

    def reset_cache(self) -> None:
        self.slots.clear()
        self._free_slots = list(range(self.num_cpu_blocks - 1, -1, -1))
        self._matched.clear()

    def make_stats(self) -> dict[str, float]:
        """vLLM's external prefix cache counters (tokens), blocks stored, and the worker's
        transfer counters."""
        return {"external_prefix_cache_queries": self.queries, "external_prefix_cache_hits": self.hits,
                "kv_offload_stored_blocks": self.stored_blocks, **self.worker_stats}
