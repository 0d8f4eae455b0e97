"""Plain dataclasses exchanged between the front end and the EngineCore.

They hold only builtins and other such dataclasses so that they cross the process
boundary as msgpack (jaxvllm/serial_utils.py). The per-request output that the scheduler
builds, EngineCoreOutput, lives in jaxvllm/outputs.py, since core imports nothing from engine.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from jaxvllm.core.stats import SchedulerStats
from jaxvllm.lora.request import LoRARequest
from jaxvllm.outputs import EngineCoreOutput
from jaxvllm.pooling_params import PoolingParams
from jaxvllm.sampling_params import SamplingParams


class EngineCoreRequestType(bytes, enum.Enum):
    """First frame of every message to the engine process: what the payload is."""
    ADD = b"\x00"
    ABORT = b"\x01"
    UTILITY = b"\x02"


@dataclass
class EngineCoreRequest:
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams | None  # None for a pooling request
    eos_token_id: int | None
    sampling_seed: int
    arrival_time: float
    priority: int = 0
    cache_salt: str | None = None
    pooling_params: PoolingParams | None = None
    lora_request: LoRARequest | None = None


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
    engine_index: int = 0  # which data-parallel core sent it (set on receipt by the DP client)
