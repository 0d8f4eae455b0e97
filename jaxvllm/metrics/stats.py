"""Per-iteration request statistics that the front end derives from engine outputs.

The engine core reports scheduler state (SchedulerStats) and, with a request's first token,
how long it queued and prefilled on its own clock; latencies the user sees are measured
here, where the user's clock is: TTFT from arrival to the first token the front end sees.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class FinishedRequestStats:
    finish_reason: str
    e2e_latency: float
    num_prompt_tokens: int
    num_generation_tokens: int
    mean_time_per_output_token: float
    queued_time: float = 0.0     # arrival to first schedule
    prefill_time: float = 0.0    # first schedule to first token
    decode_time: float = 0.0     # first token to last token
    max_tokens_param: int | None = None

    @property
    def inference_time(self) -> float:
        return self.prefill_time + self.decode_time


@dataclass
class IterationStats:
    num_prompt_tokens: int = 0  # prompts of requests that got their first token now
    num_generation_tokens: int = 0
    time_to_first_tokens_iter: list[float] = field(default_factory=list)
    inter_token_latencies_iter: list[float] = field(default_factory=list)
    finished_requests: list[FinishedRequestStats] = field(default_factory=list)
    # Per finished parent request (n > 1: over its samples): the most tokens one generated.
    max_num_generation_tokens_iter: list[int] = field(default_factory=list)
    n_params_iter: list[int] = field(default_factory=list)


@dataclass
class RequestStateStats:
    """Timestamps of one request, in time.time() seconds."""
    arrival_time: float
    first_token_time: float = 0.0
    last_token_time: float = 0.0
    num_generation_tokens: int = 0
    queued_time: float = 0.0
    prefill_time: float = 0.0
    max_tokens_param: int | None = None

    def update(self, num_new_tokens: int, now: float, num_prompt_tokens: int,
               it: IterationStats, queued_time: float | None = None,
               prefill_time: float | None = None) -> None:
        if queued_time is not None:
            self.queued_time, self.prefill_time = max(0.0, queued_time), max(0.0, prefill_time or 0.0)
        if not num_new_tokens:
            return
        if self.num_generation_tokens == 0:
            self.first_token_time = now
            it.time_to_first_tokens_iter.append(now - self.arrival_time)
            it.num_prompt_tokens += num_prompt_tokens
        else:
            it.inter_token_latencies_iter.append(now - self.last_token_time)
        self.last_token_time = now
        self.num_generation_tokens += num_new_tokens
        it.num_generation_tokens += num_new_tokens

    def finish(self, finish_reason: str, now: float, num_prompt_tokens: int,
               it: IterationStats) -> None:
        decode_tokens = self.num_generation_tokens - 1
        decode_time = self.last_token_time - self.first_token_time if self.first_token_time else 0.0
        tpot = decode_time / decode_tokens if decode_tokens > 0 else 0.0
        it.finished_requests.append(FinishedRequestStats(
            finish_reason=finish_reason, e2e_latency=now - self.arrival_time,
            num_prompt_tokens=num_prompt_tokens, num_generation_tokens=self.num_generation_tokens,
            mean_time_per_output_token=tpot, queued_time=self.queued_time,
            prefill_time=self.prefill_time, decode_time=decode_time, max_tokens_param=self.max_tokens_param))
