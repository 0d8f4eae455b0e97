"""Prompt lookup (vLLM's NgramProposer semantics): the longest suffix n-gram within
[min, max] that occurred earlier, its earliest occurrence, and the k tokens after it."""
from __future__ import annotations

import numpy as np

from jaxvllm.worker.spec_decode.ngram_proposer import NgramProposer, propose_ngram


def ngram(tokens, min_n, max_n, k):
    return propose_ngram(np.array(tokens, np.int32), min_n, max_n, k).tolist()


def test_longest_suffix_match_proposes_what_followed():
    assert ngram([1, 2, 3, 4, 1, 2, 3], 2, 2, 2) == [4, 1]
    assert ngram([1, 2, 3, 4, 1, 2, 3], 1, 3, 3) == [4, 1, 2]
    # The 3-gram [9, 2, 3] wins over the earlier 2-gram [2, 3].
    assert ngram([2, 3, 5, 9, 2, 3, 7, 8, 9, 2, 3], 2, 3, 2) == [7, 8]
    # Of two occurrences of the longest match, the earliest.
    assert ngram([1, 2, 5, 1, 2, 6, 1, 2], 2, 2, 1) == [5]


def test_no_draft_without_a_long_enough_match():
    assert ngram([1, 2, 3, 4, 5], 1, 3, 2) == []
    assert ngram([1, 2, 3, 9, 3], 2, 3, 2) == []  # only a 1-gram repeats
    assert ngram([7], 1, 3, 2) == []


def test_drafts_stop_at_the_sequence_end_and_overlap_the_suffix():
    assert ngram([4, 4, 4, 4], 1, 2, 5) == [4, 4]  # [4, 4] first ends at index 1: what follows
    assert ngram([1, 2, 3, 1, 2], 2, 2, 5) == [3, 1, 2]


def test_batch_rows_and_max_model_len():
    token_ids = np.zeros((3, 16), np.int32)
    token_ids[0, :7] = [1, 2, 3, 4, 1, 2, 3]
    token_ids[2, :5] = [5, 6, 5, 6, 5]
    num_tokens = np.array([7, 0, 5], np.int32)
    proposer = NgramProposer(1, 3, 4, max_model_len=9)
    # Row 0 may add one draft before max_model_len (7 tokens, its next computed at position 7).
    assert proposer.propose(token_ids, num_tokens, np.array([0, 2]), None, None) == [[4], [6, 5]]
