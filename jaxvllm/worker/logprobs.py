"""Logprobs on the worker: the sampled tokens' (from `sample_extended`) and the prompt's.

Both come from the model's raw distribution (vLLM's default "raw_logprobs"). The device
always computes the top MAX_LOGPROBS candidates, one compiled shape for every k; the host
cuts each request's rows down to the k it asked for.

Prompt logprobs: position j's logits score prompt token j + 1, so every prefill chunk
contributes its positions up to the prompt's second-to-last token. They are gathered
from the forward's hidden states for the flat token axis (padded to the same token
bucket, so one compilation per bucket) and sent once, with the first sampled token.
The scheduler gives such requests no prefix-cache hit and never swaps them out mid-prompt,
so every prompt position passes through here exactly once per (re)computation.
"""
from __future__ import annotations

import numpy as np

from jaxvllm.outputs import LogprobsLists


def _rows(ids: np.ndarray, lps: np.ndarray, first_ids, first_lps, ranks, k: int) -> LogprobsLists:
    """LogprobsLists with each position's own token first, then its top k."""
    return LogprobsLists([[int(t)] + row[:k].tolist() for t, row in zip(first_ids, ids)],
                         [[float(v)] + row[:k].tolist() for v, row in zip(first_lps, lps)],
                         [int(r) for r in ranks])


def sampled_logprobs(states, commits, sampled, lp) -> list[LogprobsLists | None]:
    """Each committing row's logprobs, for the requests that asked for them."""
    token_lp, rank, top_ids, top_lp = lp
    out = []
    for i, (s, commit) in enumerate(zip(states, commits)):
        k = s.sampling_params.logprobs
        out.append(None if k is None or not commit else
                   _rows(top_ids[i:i + 1], top_lp[i:i + 1], sampled[i:i + 1], token_lp[i:i + 1],
                         rank[i:i + 1], k))
    return out


def prompt_positions(states, counts, T: int):
    """Flat-axis rows to score this step, padded to T: (indices i32[T], targets i32[T],
    per request (state, first row, its targets)) for requests still owed prompt logprobs."""
    indices, targets, spans = [], [], []
    offset = 0
    for s, n in zip(states, counts):
        if s.prompt_logprobs is not None:
            start = s.num_computed_tokens
            end = min(start + n, s.num_prompt_tokens - 1)  # the last prompt token scores nothing
            if end > start:
                span_targets = s.token_ids[start + 1:end + 1]
                spans.append((s, len(indices), span_targets))
                indices.extend(range(offset, offset + end - start))
                targets.extend(span_targets)
        offset += n
    pad = T - len(indices)
    return (np.asarray(indices + [0] * pad, np.int32), np.asarray(targets + [0] * pad, np.int32),
            spans)


def accumulate_prompt_logprobs(spans, lp) -> None:
    """Appends each request's scored positions to its pending prompt logprobs."""
    token_lp, rank, top_ids, top_lp = lp
    for s, first, span_targets in spans:
        chunk = slice(first, first + len(span_targets))
        rows = _rows(top_ids[chunk], top_lp[chunk], span_targets, token_lp[chunk], rank[chunk],
                     s.sampling_params.prompt_logprobs)
        pending = s.prompt_logprobs
        pending.logprob_token_ids.extend(rows.logprob_token_ids)
        pending.logprobs.extend(rows.logprobs)
        pending.sampled_token_ranks.extend(rows.sampled_token_ranks)
