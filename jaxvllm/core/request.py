"""A request as the scheduler sees it: token ids, progress and status."""
from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from jaxvllm.lora.request import LoRARequest
from jaxvllm.outputs import FinishReason
from jaxvllm.pooling_params import PoolingParams
from jaxvllm.sampling_params import SamplingParams


class RequestStatus(enum.IntEnum):
    WAITING = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()  # blocks dropped; recomputed when it resumes
    WAITING_FOR_REMOTE_KVS = enum.auto()  # its pages are allocated; a KV connector loads them
    SWAPPED = enum.auto()    # blocks copied to the host swap space; copied back when it resumes
    # Everything after this line is a finished state.
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()
    FINISHED_IGNORED = enum.auto()
    FINISHED_ERROR = enum.auto()  # this request could not go on (its grammar failed); see `error`

    @staticmethod
    def is_finished(status: "RequestStatus") -> bool:
        return status > RequestStatus.SWAPPED

    @staticmethod
    def get_finished_reason(status: "RequestStatus") -> FinishReason | None:
        return _FINISHED_REASON_MAP.get(status)


# The one place a finished status becomes what the front end and the user see.
_FINISHED_REASON_MAP = {
    RequestStatus.FINISHED_STOPPED: FinishReason.STOP,
    RequestStatus.FINISHED_LENGTH_CAPPED: FinishReason.LENGTH,
    RequestStatus.FINISHED_ABORTED: FinishReason.ABORT,
    RequestStatus.FINISHED_IGNORED: FinishReason.LENGTH,
    RequestStatus.FINISHED_ERROR: FinishReason.ERROR,
}


@dataclass
class Request:
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams | None  # None for a pooling request
    eos_token_id: int | None
    # Every request samples from its own seed stream; the engine draws one when the
    # user gave none, so seeded and unseeded requests share one code path on device.
    sampling_seed: int
    arrival_time: float = field(default_factory=time.time)
    scheduled_time: float = 0.0  # when first scheduled (0: not yet), for the queue-time metric
    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    # Tokens sampled in a step still running on the device (async scheduling: at most one),
    # not yet in output_token_ids; the scheduler counts them as if they were.
    num_output_placeholders: int = 0
    stop_reason: int | str | None = None
    error: str | None = None  # with FINISHED_ERROR: what went wrong, for the client
    num_preemptions: int = 0
    # Lower runs first under the "priority" scheduling policy (vLLM's convention).
    priority: int = 0
    # Mixed into the first block's hash: requests with different salts never share a prefix.
    cache_salt: str | None = None
    # Hash of each full block of all_token_ids, filled in lazily by the KVCacheManager.
    block_hashes: list = field(default_factory=list)
    # A pooling request (runner="pooling"): prefilled, pooled by the worker, never decoded.
    pooling_params: PoolingParams | None = None
    # Speculative decoding: tokens the proposer drafted to follow output_token_ids, verified
    # in the next step that schedules the request (then cleared).
    spec_token_ids: list[int] = field(default_factory=list)
    # The LoRA adapter it runs with (None: the base model); also a prefix-cache key.
    lora_request: LoRARequest | None = None

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def kv_transfer_params(self) -> dict | None:
        """A KV connector's orders for it (vLLM's kv_transfer_params), from its sampling params."""
        return self.sampling_params.kv_transfer_params if self.sampling_params is not None else None

    def is_finished(self) -> bool:
        return RequestStatus.is_finished(self.status)

    def get_finished_reason(self) -> FinishReason | None:
        return RequestStatus.get_finished_reason(self.status)
