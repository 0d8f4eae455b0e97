"""SchedulerStats: a snapshot of the scheduler for metrics and tests, built on request
(make_stats) rather than every step, so the hot loop pays nothing for it."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SchedulerStats:
    num_running_reqs: int = 0
    num_waiting_reqs: int = 0   # not counting the swapped ones
    num_swapped_reqs: int = 0
    kv_cache_usage: float = 0.0
    prefix_cache_queries: int = 0  # tokens looked up at admission
    prefix_cache_hits: int = 0     # of those, found cached
    num_preemptions: int = 0       # recompute and swap together
    num_swap_outs: int = 0         # preemptions that swapped rather than recomputed
    num_prefill_tokens: int = 0    # prompt tokens actually computed (cache hits skipped)
    num_free_blocks: int = 0       # free KV blocks, evictable cached ones included
    num_total_blocks: int = 0      # usable KV blocks (the null block 0 excluded)
    num_compilations: int = 0      # XLA programs compiled so far (filled in by the EngineCore)

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0
