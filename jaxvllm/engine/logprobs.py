"""LogprobsProcessor: one request's logprobs, turned from the core's lists of numbers
into vLLM's per-position dicts {token_id: Logprob(logprob, rank, decoded_token)}.

The values are the model's raw distribution (log_softmax of the logits before any
penalty, bias, temperature or filter: vLLM's default "raw_logprobs"), so they describe
the model, not the sampling settings. cumulative_logprob sums the chosen tokens'.
"""
from __future__ import annotations

from jaxvllm.outputs import Logprob, LogprobsLists, PromptLogprobs, SampleLogprobs
from jaxvllm.sampling_params import SamplingParams


class LogprobsProcessor:
    def __init__(self, tokenizer, params: SamplingParams):
        self.tokenizer = tokenizer
        self.num_logprobs = params.logprobs
        self.num_prompt_logprobs = params.prompt_logprobs
        self.logprobs: SampleLogprobs | None = [] if params.logprobs is not None else None
        self.cumulative_logprob: float | None = 0.0 if params.logprobs is not None else None
        self.prompt_logprobs: PromptLogprobs | None = None

    def update(self, new_logprobs: LogprobsLists | None,
               new_prompt_logprobs: LogprobsLists | None) -> None:
        if new_logprobs is not None and self.logprobs is not None:
            for position in self._dicts(new_logprobs):
                self.logprobs.append(position)
            self.cumulative_logprob += sum(row[0] for row in new_logprobs.logprobs)
        if new_prompt_logprobs is not None and self.num_prompt_logprobs is not None:
            self.prompt_logprobs = [None] + self._dicts(new_prompt_logprobs)

    def _dicts(self, lists: LogprobsLists) -> list[dict[int, Logprob]]:
        """vLLM's layout: the chosen token with its own rank, then the top-k with ranks
        1..k (a chosen token that is also among the top-k appears once)."""
        out = []
        for ids, lps, rank in zip(lists.logprob_token_ids, lists.logprobs,
                                  lists.sampled_token_ranks):
            ranks = [rank] + list(range(1, len(ids)))
            out.append({t: Logprob(lp, r, self.tokenizer.decode([t]))
                        for t, lp, r in zip(ids, lps, ranks)})
        return out
