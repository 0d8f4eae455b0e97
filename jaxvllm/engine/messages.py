"""Plain dataclasses exchanged between the front end and the EngineCore.

They hold only builtins and other such dataclasses so that they cross the process
boundary as msgpack (engine/serial_utils.py).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from jaxvllm.core.stats import SchedulerStats
from jaxvllm.sampling_params import SamplingParams


class EngineCoreRequestType(bytes, enum.Enum):
    """First frame of every message to the engine process: what the payload is."""
    ADD = b"\x00"
    ABORT = b"\x01"
    UTILITY = b"\x02"


class FinishReason(enum.IntEnum):
    STOP = 0
    LENGTH = 1
    ABORT = 2
    ERROR = 3  # the engine could not serve this request (the others go on); see `error`

    def __str__(self) -> str:
        return self.name.lower()


@dataclass
class EngineCoreRequest:
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_id: int | None
    sampling_seed: int
    arrival_time: float
    priority: int = 0
    cache_salt: str | None = None


@dataclass
class LogprobsLists:
    """Logprobs of some positions (vLLM's name): row i holds position i's token first,
    then the top-k candidates in descending order; its rank among all tokens (1 = the
    most likely) is in sampled_token_ranks."""
    logprob_token_ids: list[list[int]]
    logprobs: list[list[float]]
    sampled_token_ranks: list[int]


@dataclass(slots=True)  # one per request per step: kept cheap to build
class EngineCoreOutput:
    request_id: str
    new_token_ids: list[int]
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None
    # Only for requests that asked for them (SamplingParams.logprobs / prompt_logprobs).
    new_logprobs: LogprobsLists | None = None
    new_prompt_logprobs: LogprobsLists | None = None
    error: str | None = None  # with FinishReason.ERROR: what went wrong, for the client

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class UtilityRequest:
    """A call of an EngineCore method by name (get_stats, reset_prefix_cache, ...)."""
    call_id: int
    method: str
    args: list[Any] = field(default_factory=list)


@dataclass
class UtilityOutput:
    call_id: int
    result: Any = None
    failure_message: str | None = None


@dataclass
class EngineCoreOutputs:
    """One message from the engine process: a step's outputs, a utility result, or both."""
    outputs: list[EngineCoreOutput] = field(default_factory=list)
    scheduler_stats: SchedulerStats | None = None
    timestamp: float = 0.0
    utility_output: UtilityOutput | None = None
