"""What each layer returns, with vLLM's class and field names (vLLM's `vllm/v1/outputs.py`):
the worker's `ModelRunnerOutput` to the scheduler, the scheduler's `EngineCoreOutput` to the
front end, and `RequestOutput` to the user. A leaf module, so that core, worker and engine
all import their messages from here and never from each other.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar

import numpy as np


class FinishReason(enum.IntEnum):
    """Why a request ended; core/request.py maps each finished RequestStatus to one."""
    STOP = 0
    LENGTH = 1
    ABORT = 2
    ERROR = 3  # the engine could not serve this request (the others go on); see `error`

    def __str__(self) -> str:
        return self.name.lower()


@dataclass
class LogprobsLists:
    """Logprobs of some positions (vLLM's name): row i holds position i's token first,
    then the top-k candidates in descending order; its rank among all tokens (1 = the
    most likely) is in sampled_token_ranks."""
    logprob_token_ids: list[list[int]]
    logprobs: list[list[float]]
    sampled_token_ranks: list[int]

    def first(self, n: int) -> LogprobsLists:
        """The first n positions' (a stop inside speculative decoding's accepted run cuts them)."""
        return LogprobsLists(self.logprob_token_ids[:n], self.logprobs[:n], self.sampled_token_ranks[:n])


@dataclass
class KVConnectorOutput:
    """What a KV connector's worker side reports after a step (vLLM's name): requests whose
    sends or receives ended, and the connector's counters (cumulative, by name)."""
    finished_sending: set[str] = field(default_factory=set)
    finished_recving: set[str] = field(default_factory=set)
    kv_connector_stats: dict[str, float] = field(default_factory=dict)
    # Pages a finished receive could not fill (the transfer failed): computed again.
    invalid_block_ids: set[int] = field(default_factory=set)


@dataclass
class ModelRunnerOutput:
    """The worker's answer to one SchedulerOutput: the token each scheduled request sampled."""
    req_ids: list[str]
    # One list per request: the sampled token, or empty for a partial prefill chunk.
    sampled_token_ids: list[list[int]]
    # Per request, for those that asked (else None); None altogether when nobody did.
    logprobs: list[LogprobsLists | None] | None = None
    # A request's prompt logprobs, sent with its first sampled token.
    prompt_logprobs: dict[str, LogprobsLists] = field(default_factory=dict)
    # The pooling runner's: per request, its pooled output (a vector, or one per token, as
    # lists: they cross processes as msgpack) once its prompt is computed, else None.
    pooler_output: list[list | None] = field(default_factory=list)
    # Speculative decoding (else None): per request, the proposer's drafts for its next step;
    # sampled_token_ids then holds each request's accepted drafts and one token after them.
    spec_token_ids: list[list[int]] | None = None
    # A KV connector's report (kv_transfer/base.py), where one runs.
    kv_connector_output: KVConnectorOutput | None = None


@dataclass(slots=True)  # one per request per step: kept cheap to build
class EngineCoreOutput:
    """What the scheduler reports for one request after a step."""
    request_id: str
    new_token_ids: list[int]
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None
    # Only for requests that asked for them (SamplingParams.logprobs / prompt_logprobs).
    new_logprobs: LogprobsLists | None = None
    new_prompt_logprobs: LogprobsLists | None = None
    error: str | None = None  # with FinishReason.ERROR: what went wrong, for the client
    # With a request's first token only: seconds it waited before its first schedule, and
    # from then to this token, both on the engine core's clock (vLLM's queued/prefill time).
    queued_time: float | None = None
    prefill_time: float | None = None
    pooling_output: list | None = None  # a pooling request's result (ModelRunnerOutput.pooler_output)
    # With the finishing output: what a KV connector hands on (a prefill engine's KV to pull).
    kv_transfer_params: dict | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class Logprob:
    """One candidate token at one position: its logprob under the model's raw
    distribution, its rank there (1 = most likely) and its text."""
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


# One dict per position: token id -> Logprob (the chosen token and the top-k).
SampleLogprobs = list[dict[int, Logprob]]
PromptLogprobs = list[dict[int, Logprob] | None]


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None
    logprobs: SampleLogprobs | None = None  # with SamplingParams.logprobs
    finish_reason: str | None = None  # "stop", "length" or "abort"
    stop_reason: int | str | None = None  # the stop token id or stop string that ended it

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = False
    prompt_logprobs: PromptLogprobs | None = None  # with SamplingParams.prompt_logprobs; first is None
    kv_transfer_params: dict | None = None  # a prefill engine's, for the decode engine (P/D)


# ---- pooling models (vLLM's PoolingRequestOutput and its task-specific views) -----------
@dataclass
class PoolingOutput:
    """A pooled hidden state (or one per token, pooling_type ALL), or a classifier's output."""
    data: np.ndarray


_O = TypeVar("_O")


@dataclass
class PoolingRequestOutput(Generic[_O]):
    request_id: str
    outputs: _O
    prompt_token_ids: list[int]
    finished: bool = True
    num_cached_tokens: int = 0
    prompt: str | None = None
    _output_type: ClassVar[Any]  # a task's output class (EmbeddingOutput, ...), which makes its view

    @classmethod
    def from_base(cls, base: "PoolingRequestOutput"):
        """The task's view of a PoolingRequestOutput (EmbeddingRequestOutput.from_base, ...)."""
        return cls(base.request_id, cls._output_type.from_base(base.outputs), base.prompt_token_ids,
                   base.finished, base.num_cached_tokens, base.prompt)


@dataclass
class EmbeddingOutput:
    embedding: list[float]

    @classmethod
    def from_base(cls, output: PoolingOutput) -> "EmbeddingOutput":
        if output.data.ndim != 1:
            raise ValueError("pooled data should be a 1-D embedding vector")
        return cls(output.data.tolist())

    @property
    def hidden_size(self) -> int:
        return len(self.embedding)


@dataclass
class ClassificationOutput:
    probs: list[float]

    @classmethod
    def from_base(cls, output: PoolingOutput) -> "ClassificationOutput":
        if output.data.ndim != 1:
            raise ValueError("pooled data should be a 1-D probability vector")
        return cls(output.data.tolist())

    @property
    def num_classes(self) -> int:
        return len(self.probs)


@dataclass
class ScoringOutput:
    score: float

    @classmethod
    def from_base(cls, output: PoolingOutput) -> "ScoringOutput":
        if output.data.ndim != 0:
            raise ValueError("pooled data should be a scalar score")
        return cls(output.data.item())


class EmbeddingRequestOutput(PoolingRequestOutput[EmbeddingOutput]):
    _output_type = EmbeddingOutput


class ClassificationRequestOutput(PoolingRequestOutput[ClassificationOutput]):
    _output_type = ClassificationOutput


class ScoringRequestOutput(PoolingRequestOutput[ScoringOutput]):
    _output_type = ScoringOutput
