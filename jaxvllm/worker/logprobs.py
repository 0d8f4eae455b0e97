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

import jax
import numpy as np

from jaxvllm.outputs import LogprobsLists


def _rows(ids: np.ndarray, lps: np.ndarray, first_ids, first_lps, ranks, k: int) -> LogprobsLists:
    """LogprobsLists with each position's own token first, then its top k."""
    return LogprobsLists([[int(t)] + row[:k].tolist() for t, row in zip(first_ids, ids)],
                         [[float(v)] + row[:k].tolist() for v, row in zip(first_lps, lps)],
                         [int(r) for r in ranks])


def sampled_logprobs(num_logprobs: np.ndarray, commit: np.ndarray, sampled,
                     lp) -> list[LogprobsLists | None]:
    """Each committing row's logprobs, for the requests that asked for them (num_logprobs:
    the k each row asked for, -1 for none)."""
    token_lp, rank, top_ids, top_lp = lp
    out: list[LogprobsLists | None] = [None] * len(num_logprobs)
    for i in np.flatnonzero((num_logprobs >= 0) & commit).tolist():
        out[i] = _rows(top_ids[i:i + 1], top_lp[i:i + 1], sampled[i:i + 1], token_lp[i:i + 1],
                       rank[i:i + 1], int(num_logprobs[i]))
    return out


def prompt_positions(batch, owing, step_index: dict[int, int], rows, counts, T: int):
    """Flat-axis rows to score this step, padded to T: (indices i32[T], targets i32[T],
    per request (state, first row, its targets)) for the requests `owing` prompt logprobs
    that this step schedules (step_index: batch row -> index in the step)."""
    indices, targets, spans = [], [], []
    offsets = np.cumsum(counts) - counts
    for s in owing:
        i = step_index.get(s.slot)
        if i is None:
            continue
        start = int(batch.num_computed_tokens[rows[i]])
        end = min(start + int(counts[i]), s.num_prompt_tokens - 1)  # the last prompt token scores nothing
        if end > start:
            span_targets = batch.token_list(s, start + 1, end + 1)
            spans.append((s, len(indices), span_targets))
            offset = int(offsets[i])
            indices.extend(range(offset, offset + end - start))
            targets.extend(span_targets)
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


def step_prompt_logprobs(batch, rows, counts, commit, T: int, score) -> dict[str, LogprobsLists]:
    """Scores this step's prompt positions of the requests that asked (score(indices,
    targets): the device's logprobs arrays); returns the prompt logprobs of those that sample
    their first token now, which are sent with it."""
    step_index = {r: i for i, r in enumerate(rows.tolist())}
    indices, targets, spans = prompt_positions(batch, batch.owing_prompt_logprobs, step_index,
                                               rows, counts, T)
    if spans:
        accumulate_prompt_logprobs(spans, jax.device_get(score(indices, targets)))
    done = {}
    for state in list(batch.owing_prompt_logprobs):
        i = step_index.get(state.slot)
        if i is not None and commit[i]:
            done[state.req_id], state.prompt_logprobs = state.prompt_logprobs, None
            batch.owing_prompt_logprobs.discard(state)
    return done


def accepted_logprobs(num_logprobs: np.ndarray, num_tokens: np.ndarray, tokens: np.ndarray,
                      lp) -> list[LogprobsLists | None]:
    """Speculative decoding's: a row per token each request emitted this step (num_tokens of
    tokens [N, K + 1]), for the requests that asked; lp holds every position's [R * (K + 1)]."""
    K1 = tokens.shape[1]
    token_lp, rank, top_ids, top_lp = (x.reshape(-1, K1, *x.shape[1:]) for x in lp)
    out: list[LogprobsLists | None] = [None] * len(num_logprobs)
    for i in np.flatnonzero((num_logprobs >= 0) & (num_tokens > 0)).tolist():
        n = int(num_tokens[i])
        out[i] = _rows(top_ids[i, :n], top_lp[i, :n], tokens[i, :n], token_lp[i, :n], rank[i, :n],
                       int(num_logprobs[i]))
    return out
