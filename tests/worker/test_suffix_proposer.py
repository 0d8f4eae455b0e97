"""Suffix decoding's proposer (vLLM's method="suffix"): drafts from the prompt and from this and
earlier requests' responses, as long as the matched suffix allows and while the path stays
likely; responses cached across requests up to max_cached_requests, then taken out again."""
from __future__ import annotations

import numpy as np

from jaxvllm.worker.spec_decode.suffix_proposer import ContinuationCounts, SuffixProposer


def test_the_longest_matched_suffix_bounds_the_draft():
    table = ContinuationCounts(depth=8)
    table.add([1, 2, 3, 4, 5, 6, 7, 8])
    # "3" alone matched: one draft at factor 1, two at factor 2; "2 3" matched: two at factor 1.
    assert table.speculate([9, 3], 8, 1.0, 0.1)[0] == [4]
    assert table.speculate([9, 3], 8, 2.0, 0.1)[0] == [4, 5]
    assert table.speculate([2, 3], 8, 1.0, 0.1)[0] == [4, 5]
    assert table.speculate([1, 2, 3], 2, 1.0, 0.1)[0] == [4, 5]  # max_tokens
    assert table.speculate([9], 8, 1.0, 0.1) == ([], 0.0)  # no match


def test_an_unlikely_path_stops_the_draft():
    table = ContinuationCounts(depth=4)
    for tail in ([10], [11], [12]):  # after "1 2 3" comes 10, 11 or 12, each a third of the time
        table.add([1, 2, 3] + tail)
    assert table.speculate([1, 2, 3], 4, 4.0, 0.5)[0] == []
    drafts, score = table.speculate([1, 2, 3], 4, 4.0, 0.3)
    assert len(drafts) == 1 and drafts[0] in (10, 11, 12) and abs(score - 1 / 3) < 1e-9


def test_removing_a_text_takes_out_exactly_its_counts():
    table = ContinuationCounts(depth=3)
    table.add([5, 6, 7, 5, 6])
    before = {k: dict(v) for k, v in table.next.items()}
    table.add([6, 7, 8, 9])
    table.add([6, 7, 8, 9], sign=-1)
    assert table.next == before
    table.add([5, 6, 7, 5, 6], sign=-1)
    assert table.next == {}


def batch(*seqs, width=32):
    token_ids = np.zeros((len(seqs), width), np.int32)
    for i, s in enumerate(seqs):
        token_ids[i, :len(s)] = s
    return token_ids, np.array([len(s) for s in seqs], np.int32)


def test_responses_of_finished_requests_draft_for_later_ones_until_evicted():
    proposer = SuffixProposer(4, max_model_len=64, max_tree_depth=8, max_cached_requests=1,
                              max_spec_factor=2.0, min_token_prob=0.1)
    prompt, response = [1, 2, 3], [20, 21, 22, 23, 24, 25]
    token_ids, n = batch(prompt + response)
    assert proposer.propose(token_ids, n, np.array([0]), np.array([3]), ["a"]) == [[]]  # "25": never followed
    proposer.finish_requests({"a"})
    # Another request (another prompt) whose response starts as a's did: a's response drafts.
    token_ids, n = batch([7, 8, 20, 21])
    assert proposer.propose(token_ids, n, np.array([0]), np.array([2]), ["b"]) == [[22, 23, 24, 25]]
    proposer.finish_requests({"b"})  # b's response is cached, a's (the older) taken out
    token_ids, n = batch([9, 22, 23])
    assert proposer.propose(token_ids, n, np.array([0]), np.array([1]), ["c"]) == [[]]
    assert proposer.propose(*batch([9, 20]), np.array([0]), np.array([1]), ["d"]) == [[21]]  # b's


def test_a_request_drafts_from_its_own_prompt_and_running_response_within_max_model_len():
    proposer = SuffixProposer(3, max_model_len=12, max_tree_depth=4, max_cached_requests=0,
                              max_spec_factor=1.0, min_token_prob=0.1)
    token_ids, n = batch([1, 2, 3, 4, 5, 1, 2, 3], [6, 6, 7, 8, 9, 7, 8])
    prompts = np.array([6, 5])
    # Row 0: "1 2 3" in its prompt (3 drafts; 8 tokens and max_model_len 12 leave room for 3).
    # Row 1: "7 8" matched in its prompt allows 2 drafts: 9, then nothing ever followed "7 8 9".
    assert proposer.propose(token_ids, n, np.array([0, 1]), prompts, ["x", "y"]) == [[4, 5, 1], [9]]
    token_ids, n = batch([1, 2, 3, 4, 5, 1, 2, 3, 4, 5])
    assert proposer.propose(token_ids, n, np.array([0]), np.array([6]), ["x"]) == [[1]]  # 10 of 12 tokens
    proposer.finish_requests({"x", "y"})
    assert proposer.responses.next == {} and proposer.active == {}  # max_cached_requests 0: nothing kept
