"""Prompt lookup (vLLM's NgramProposer, method="ngram"): find the longest suffix of a
request's tokens, of prompt_lookup_min..max tokens, that occurred earlier in them (the
earliest such occurrence), and propose the k tokens that followed it.

Each request's search is one vectorized numpy pass: for every earlier end position, how many
tokens before it match the sequence's suffix (capped at prompt_lookup_max), from one boolean
matrix of max_n rows; no Python loop over positions.
"""
from __future__ import annotations

import numpy as np


def propose_ngram(tokens: np.ndarray, min_n: int, max_n: int, k: int) -> np.ndarray:
    """The drafts for one sequence (i32, up to k tokens; empty when no n-gram matches)."""
    total = len(tokens)
    if total < min_n + 1 or k <= 0:
        return tokens[:0]
    n = min(max_n, total - 1)
    # match[t, e]: token e - t equals the sequence's token total - 1 - t, for candidate match
    # ends e in [0, total - 1) (the suffix itself, e = total - 1, is not a candidate).
    ends = np.arange(total - 1)
    before = ends[None, :] - np.arange(n)[:, None]
    match = (before >= 0) & (tokens[np.maximum(before, 0)] == tokens[total - 1 - np.arange(n)][:, None])
    lengths = np.cumprod(match, axis=0).sum(axis=0)  # suffix tokens matched ending at e
    best = int(lengths.max())
    if best < min_n:
        return tokens[:0]
    start = int(np.argmax(lengths == best)) + 1  # the earliest occurrence's next token
    return tokens[start:start + k]


class NgramProposer:
    def __init__(self, prompt_lookup_min: int, prompt_lookup_max: int, num_speculative_tokens: int,
                 max_model_len: int):
        self.min_n, self.max_n = prompt_lookup_min, prompt_lookup_max
        self.k, self.max_model_len = num_speculative_tokens, max_model_len

    def propose(self, token_ids: np.ndarray, num_tokens: np.ndarray, rows: np.ndarray, num_prompt_tokens=None,
                req_ids=None) -> list[list[int]]:
        """Drafts for each of `rows` of the batch's token matrix (num_tokens: each row's
        length), never past max_model_len. Prompt lookup keeps no state: it needs neither
        the prompts' lengths nor the requests' ids that the suffix proposer takes."""
        drafts = []
        for row, n in zip(rows.tolist(), num_tokens[rows].tolist()):
            k = min(self.k, self.max_model_len - 1 - n)
            drafts.append(propose_ngram(token_ids[row, :n], self.min_n, self.max_n, k).tolist())
        return drafts

    def finish_requests(self, req_ids) -> None:
        """Nothing to forget (the suffix proposer's interface)."""
