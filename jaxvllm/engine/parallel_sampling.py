"""Parallel sampling (SamplingParams.n > 1), as vLLM V1 does it in the front end.

A request with n > 1 becomes n independent child requests "{i}_{request_id}" with n=1,
each on its own seed stream (seed + i when the user gave a seed). They carry the same
prompt, so the prefix cache gives every child after the first the prompt's KV blocks
instead of computing them again; nothing below the front end knows about parents.
The children's outputs are gathered back into one RequestOutput with n
CompletionOutputs, index i for child i.
"""
from __future__ import annotations

import dataclasses

from jaxvllm.outputs import CompletionOutput, RequestOutput
from jaxvllm.sampling_params import RequestOutputKind, SamplingParams


class ParentRequest:
    def __init__(self, request_id: str, params: SamplingParams):
        self.request_id = request_id
        self.params = params
        self.completions: list[CompletionOutput | None] = [None] * params.n
        self.num_finished = 0
        # For the metrics: the most tokens one sample generated, over the finished ones.
        self.max_num_generation_tokens = 0
        self.num_finished_stats = 0

    @classmethod
    def from_params(cls, request_id: str, params: SamplingParams) -> "ParentRequest | None":
        """The fan-out, shared by every front end: None when n == 1 (no parent needed)."""
        return cls(request_id, params) if getattr(params, "n", 1) > 1 else None  # PoolingParams: n is 1

    def child_requests(self) -> list[tuple[str, SamplingParams]]:
        seed = self.params.seed
        return [(f"{i}_{self.request_id}",
                 dataclasses.replace(self.params, n=1,
                                     seed=None if seed is None else (seed + i) % 2**63))
                for i in range(self.params.n)]

    def make_request_output(self, index: int, completion: CompletionOutput, prompt: str | None,
                            prompt_token_ids: list[int], prompt_logprobs,
                            kind: RequestOutputKind) -> RequestOutput | None:
        """The parent's output after child `index` produced `completion`, finished once
        all n are: with CUMULATIVE every child's latest completion, with DELTA only this
        child's (its index tells which), with FINAL_ONLY nothing until the last finishes."""
        if completion.finished() and (self.completions[index] is None
                                      or not self.completions[index].finished()):
            self.num_finished += 1
        self.completions[index] = completion
        if kind == RequestOutputKind.FINAL_ONLY and not self.finished:
            return None
        outputs = ([completion] if kind == RequestOutputKind.DELTA
                   else [c for c in self.completions if c is not None])
        return RequestOutput(request_id=self.request_id, prompt=prompt,
                             prompt_token_ids=prompt_token_ids, outputs=outputs,
                             finished=self.finished, prompt_logprobs=prompt_logprobs)

    @property
    def finished(self) -> bool:
        return self.num_finished == self.params.n
