"""Suffix decoding (vLLM's method="suffix", after Arctic Inference's SuffixDecodingCache): drafts
come from what followed the current suffix, both in this request's prompt and in the responses
of this and earlier requests (agents and coding loops repeat themselves across requests), and
the draft grows with how long a suffix matched and stops where its path gets unlikely.

The suffix trees are kept as continuation counts per context: for every context of 1..depth
tokens in a text, how often each token followed it (a suffix trie of that depth, flattened to a
dict). The request's prompt gets one; the responses share one, bounded to the last
`max_cached_requests` requests (the oldest response's counts are taken out again).

Speculation from one table: the longest suffix of the request's last `depth` tokens that the
table holds (match length m) allows up to m * max_spec_factor drafts; each step takes the
most frequent continuation, multiplying its frequency into the path's probability, and stops
when that falls below min_token_prob. Of the prompt's and the responses' drafts, the one with
the higher score (the sum of its path probabilities) is proposed.
"""
from __future__ import annotations

import collections

import numpy as np


class ContinuationCounts:
    """How often each token followed each context of 1..depth tokens in the texts added."""

    def __init__(self, depth: int):
        self.depth = depth
        self.next: dict[tuple[int, ...], dict[int, int]] = {}

    def add(self, text: list[int], start: int = 0, sign: int = 1) -> None:
        """Counts text[start:], each token after its contexts within `text` (sign -1: removes
        what an earlier add of the same text counted)."""
        for i in range(max(start, 1), len(text)):
            token = text[i]
            for d in range(1, min(self.depth, i) + 1):
                context = tuple(text[i - d:i])
                counts = self.next.setdefault(context, {})
                counts[token] = counts.get(token, 0) + sign
                if counts[token] <= 0:
                    del counts[token]
                    if not counts:
                        del self.next[context]

    def speculate(self, context: list[int], max_tokens: int, max_spec_factor: float,
                  min_token_prob: float) -> tuple[list[int], float]:
        """(drafts, score) following the longest suffix of `context` this table holds."""
        match = next((d for d in range(min(self.depth, len(context)), 0, -1)
                      if tuple(context[-d:]) in self.next), 0)
        limit = min(max_tokens, int(match * max_spec_factor))
        suffix, drafts, prob, score = list(context[len(context) - match:]), [], 1.0, 0.0
        while len(drafts) < limit:
            counts = self.next.get(tuple(suffix))
            if not counts:
                break
            token, count = max(counts.items(), key=lambda kv: kv[1])
            prob *= count / sum(counts.values())
            if prob < min_token_prob:
                break
            drafts.append(token)
            score += prob
            suffix = (suffix + [token])[-self.depth:]
        return drafts, score


class _Request:
    def __init__(self, depth: int):
        self.prompt = ContinuationCounts(depth)
        self.response: list[int] = []  # its tokens after the prompt, as counted so far


class SuffixProposer:
    def __init__(self, num_speculative_tokens: int, max_model_len: int, max_tree_depth: int,
                 max_cached_requests: int, max_spec_factor: float, min_token_prob: float):
        self.k, self.max_model_len, self.depth = num_speculative_tokens, max_model_len, max_tree_depth
        self.max_cached_requests = max_cached_requests
        self.max_spec_factor, self.min_token_prob = max_spec_factor, min_token_prob
        self.responses = ContinuationCounts(max_tree_depth)  # running requests' and cached ones'
        self.active: dict[str, _Request] = {}
        self.cached: collections.OrderedDict[str, list[int]] = collections.OrderedDict()  # finished, oldest first

    def propose(self, token_ids: np.ndarray, num_tokens: np.ndarray, rows: np.ndarray,
                num_prompt_tokens: np.ndarray, req_ids: list[str]) -> list[list[int]]:
        """Drafts for each of `rows` (their requests `req_ids`), never past max_model_len; first
        counts the tokens each request gained since its last proposal."""
        drafts = []
        for row, req_id in zip(rows.tolist(), req_ids):
            n, p = int(num_tokens[row]), int(num_prompt_tokens[row])
            req = self.active.get(req_id)
            if req is None:
                req = self.active[req_id] = _Request(self.depth)
                req.prompt.add(token_ids[row, :p].tolist())
            start = len(req.response)
            if n > p + start:  # only the new tokens cross to Python, and only they are counted
                req.response.extend(token_ids[row, p + start:n].tolist())
                self.responses.add(req.response, start)
            k = min(self.k, self.max_model_len - 1 - n)
            context = token_ids[row, max(n - self.depth, 0):n].tolist()
            best = max((t.speculate(context, k, self.max_spec_factor, self.min_token_prob)
                        for t in (req.prompt, self.responses)), key=lambda ds: ds[1])
            drafts.append(best[0] if k > 0 else [])
        return drafts

    def finish_requests(self, req_ids) -> None:
        """Finished or aborted requests: their prompt counts go, their responses stay cached
        (the oldest taken out past max_cached_requests)."""
        for req_id in req_ids:
            req = self.active.pop(req_id, None)
            if req is not None:
                if req_id in self.cached:  # an id used again: its earlier response goes first
                    self.responses.add(self.cached.pop(req_id), sign=-1)
                self.cached[req_id] = req.response
        while len(self.cached) > self.max_cached_requests:
            self.responses.add(self.cached.popitem(last=False)[1], sign=-1)
