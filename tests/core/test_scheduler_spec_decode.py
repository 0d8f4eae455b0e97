"""The scheduler with speculative decoding, driven by hand-written runner outputs: drafts are
scheduled with the token they follow and budgeted, rejected positions are uncomputed, stops
inside an accepted run truncate it there, the counters move, and every block returns."""
from __future__ import annotations

from sched_harness import make_scheduler

from jaxvllm.core.request import Request, RequestStatus
from jaxvllm.outputs import FinishReason, ModelRunnerOutput
from jaxvllm.sampling_params import SamplingParams

EOS = 2


def setup(max_tokens=20, max_num_batched_tokens=64, prompt=(5, 6, 7, 5, 6), **params):
    sched = make_scheduler(max_num_seqs=4, max_num_batched_tokens=max_num_batched_tokens, max_model_len=64,
                           num_blocks=32, block_size=4, num_spec_tokens=3)
    request = Request("a", list(prompt), SamplingParams(temperature=0, max_tokens=max_tokens, **params),
                      eos_token_id=EOS, sampling_seed=0)
    sched.add_request(request)
    out = sched.schedule()
    assert out.num_scheduled_tokens == {"a": len(prompt)} and not out.scheduled_spec_decode_tokens
    sched.update_from_output(out, ModelRunnerOutput(["a"], [[7]], spec_token_ids=[[5, 6, 7]]))
    return sched, request


def step(sched, tokens, next_drafts=()):
    out = sched.schedule()
    return out, sched.update_from_output(out, ModelRunnerOutput(["a"], [tokens], spec_token_ids=[list(next_drafts)]))


def pool_is_full(sched) -> bool:
    pool = sched.kv_cache_manager.block_pool
    return pool.get_num_free_blocks() == pool.num_blocks - 1 and not sched.requests


def test_drafts_are_scheduled_and_rejected_positions_uncomputed():
    sched, request = setup()
    assert request.spec_token_ids == [5, 6, 7]
    out, outputs = step(sched, [5, 9], next_drafts=[4])  # draft 0 accepted, then 9
    assert out.num_scheduled_tokens == {"a": 4} and out.scheduled_spec_decode_tokens == {"a": [5, 6, 7]}
    # Positions 5 (token 7) and 6 (draft 5) stay computed; 7 and 8 (drafts 6, 7) are not.
    assert request.num_computed_tokens == 7 and request.output_token_ids == [7, 5, 9]
    assert outputs[0].new_token_ids == [5, 9] and not outputs[0].finished
    assert request.spec_token_ids == [4]
    out, _ = step(sched, [3])  # draft rejected: the sampler's own token
    assert out.num_scheduled_tokens == {"a": 2} and request.num_computed_tokens == 8
    stats = sched.make_stats()
    assert (stats.spec_decode_num_drafts, stats.spec_decode_num_draft_tokens,
            stats.spec_decode_num_accepted_tokens) == (2, 4, 1)
    assert stats.spec_decode_num_accepted_tokens_per_pos == [1, 0, 0]
    assert stats.spec_decode_mean_acceptance_length == 1.5 and stats.spec_decode_acceptance_rate == 0.25
    # The table covers the lookahead slots (5 prompt + 4 scheduled = 9 positions: 3 blocks).
    assert len(sched.kv_cache_manager.get_block_ids("a")[0]) == 3
    sched.abort_requests("a")
    assert pool_is_full(sched)


def test_the_budget_and_max_tokens_cap_the_drafts():
    sched, request = setup(max_num_batched_tokens=3, prompt=(5, 6))
    out = sched.schedule()
    assert out.num_scheduled_tokens == {"a": 3} and out.scheduled_spec_decode_tokens == {"a": [5, 6]}
    assert request.spec_token_ids == [] and request.num_computed_tokens == 5
    _, request = setup(max_tokens=3)  # one token out, two to go: one draft at most
    assert request.spec_token_ids == [5]


def test_eos_inside_an_accepted_run_ends_the_request_there():
    sched, request = setup()
    request.spec_token_ids = [EOS, 3, 4]
    _, outputs = step(sched, [EOS, 3, 4, 8])
    assert request.output_token_ids == [7, EOS] and outputs[0].new_token_ids == [EOS]
    assert outputs[0].finish_reason == FinishReason.STOP
    assert pool_is_full(sched)


def test_stop_token_and_max_tokens_inside_an_accepted_run():
    sched, request = setup(stop_token_ids=[4])
    _, outputs = step(sched, [5, 4, 7, 8])
    assert outputs[0].new_token_ids == [5, 4] and outputs[0].stop_reason == 4
    assert request.status == RequestStatus.FINISHED_STOPPED and pool_is_full(sched)
    sched, request = setup(max_tokens=3)
    request.spec_token_ids = [5, 6, 7]  # more than max_tokens leaves room for
    _, outputs = step(sched, [5, 6, 7, 8])
    assert request.output_token_ids == [7, 5, 6] and outputs[0].finish_reason == FinishReason.LENGTH
    assert pool_is_full(sched)
