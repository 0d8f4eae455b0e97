"""`SchedulerOutput`: what the scheduler sends the worker each step.

Full data for requests it has not seen (new ones and ones resumed after preemption, with the
blocks to copy in for a swapped one), only diffs for requests it already holds. What comes
back, `ModelRunnerOutput`, is in jaxvllm/outputs.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from jaxvllm.lora.request import LoRARequest
from jaxvllm.pooling_params import PoolingParams
from jaxvllm.sampling_params import SamplingParams


@dataclass
class NewRequestData:
    req_id: str
    prompt_token_ids: list[int]
    # Tokens generated before a preemption; they are recomputed like prompt tokens.
    output_token_ids: list[int]
    sampling_params: SamplingParams | None
    sampling_seed: int
    eos_token_id: int | None
    block_ids: tuple[list[int], ...]  # one table per KV cache group (0: out of a window)
    num_computed_tokens: int
    pooling_params: PoolingParams | None = None
    lora_request: LoRARequest | None = None


@dataclass
class CachedRequestData:
    """Requests the worker already holds: it appends its own sampled tokens, so only
    the blocks added this step and the progress counter are sent."""
    req_ids: list[str] = field(default_factory=list)
    new_block_ids: list[tuple[list[int], ...]] = field(default_factory=list)  # per request, per group
    num_computed_tokens: list[int] = field(default_factory=list)


@dataclass
class SchedulerOutput:
    scheduled_new_reqs: list[NewRequestData]
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: dict[str, int]
    total_num_scheduled_tokens: int
    # The worker drops its state for these before running the step; preempted
    # requests come back later as new requests.
    finished_req_ids: set[str]
    preempted_req_ids: set[str]
    # Swap preemption, executed by the worker before the forward, outs first: pairs of
    # (device block id, host slot) to copy out, then (host slot, device block id) to copy
    # back into a resumed request's freshly allocated blocks.
    blocks_to_swap_out: list[tuple[int, int]] = field(default_factory=list)
    blocks_to_swap_in: list[tuple[int, int]] = field(default_factory=list)
    # Structured output: allowed-token bitmask words (int32) of each constrained request
    # that samples this step (core/structured_output.py).
    grammar_bitmask: dict[str, list[int]] = field(default_factory=dict)
    # Speculative decoding: each request's draft tokens scheduled this step (vLLM's name);
    # they follow its last token in num_scheduled_tokens, and the verify step scores them.
    scheduled_spec_decode_tokens: dict[str, list[int]] = field(default_factory=dict)
    # A KV connector's orders for the worker this step (its own dataclass; vLLM's name).
    kv_connector_metadata: Any = None

