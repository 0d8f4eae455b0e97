"""SchedulerStats: a snapshot of the scheduler for metrics and tests, built on request
(make_stats) rather than every step, so the hot loop pays nothing for it."""
from __future__ import annotations

from dataclasses import dataclass, field


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
    # Speculative decoding, cumulative (core/spec_decode.py; vLLM's vllm:spec_decode_* names).
    spec_decode_num_drafts: int = 0
    spec_decode_num_draft_tokens: int = 0
    spec_decode_num_accepted_tokens: int = 0
    spec_decode_num_accepted_tokens_per_pos: list[int] = field(default_factory=list)
    # A KV connector's counters, cumulative (kv_transfer; vLLM's names:
    # external_prefix_cache_queries/hits in tokens, {transfer_type}_total_bytes/_time).
    kv_connector_stats: dict[str, float] = field(default_factory=dict)

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0

    @property
    def spec_decode_mean_acceptance_length(self) -> float:
        """Tokens per verified request per step: its accepted drafts and the one after them."""
        drafts = self.spec_decode_num_drafts
        return 1.0 + self.spec_decode_num_accepted_tokens / drafts if drafts else 0.0

    @property
    def spec_decode_acceptance_rate(self) -> float:
        tokens = self.spec_decode_num_draft_tokens
        return self.spec_decode_num_accepted_tokens / tokens if tokens else 0.0
