"""Scheduler with prefix caching, swap preemption, the priority policy and the long-prefill
cap: random workloads through the checking harness, then targeted cases."""
from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from sched_harness import FakeWorker, Spec, check_final, hashed_tokens, make_scheduler, run, scenarios

from jaxvllm.core.kv_cache_manager import cdiv
from jaxvllm.core.request import Request, RequestStatus
from jaxvllm.sampling_params import SamplingParams

SLOW_SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])


@settings(max_examples=250, **SLOW_SETTINGS)
@given(scenarios(options=True))
def test_random_workloads_with_all_options_keep_invariants(scenario):
    cfg, specs, aborts, seed = scenario
    token_fn = hashed_tokens(seed)
    res = run(specs, token_fn=token_fn, aborts=aborts, **cfg)
    check_final(specs, res, cfg["max_model_len"], token_fn)


@settings(max_examples=60, **SLOW_SETTINGS)
@given(scenarios(with_aborts=False))
def test_outputs_identical_with_caching_and_swap_under_a_tiny_pool(scenario):
    cfg, specs, _, seed = scenario
    token_fn = hashed_tokens(seed)
    tiny = dict(cfg, num_blocks=cdiv(cfg["max_model_len"], cfg["block_size"]) + 1)
    runs = [run(specs, token_fn=token_fn, **cfg),
            run(specs, token_fn=token_fn, enable_prefix_caching=True, **tiny),
            run(specs, token_fn=token_fn, preemption_mode="swap", num_swap_blocks=64, **tiny),
            run(specs, token_fn=token_fn, enable_prefix_caching=True, preemption_mode="swap",
                num_swap_blocks=2, **tiny),
            run(specs, token_fn=token_fn, enable_prefix_caching=True, num_cpu_blocks=64, **tiny)]
    for res in runs[1:]:
        assert dict(res.outputs) == dict(runs[0].outputs)
        assert res.finish == runs[0].finish
    check_final(specs, runs[1], cfg["max_model_len"], token_fn)


def shared_prefix_specs(n: int, prefix_len: int, tail_len: int, arrival_gap: int = 1):
    return [Spec(prompt=[1] * prefix_len + [2 + i] * tail_len,
                 params=SamplingParams(max_tokens=3, ignore_eos=True), arrival_step=i * arrival_gap)
            for i in range(n)]


def test_shared_prefix_is_computed_once():
    specs = shared_prefix_specs(4, prefix_len=12, tail_len=2)
    kw = dict(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=32, num_blocks=40,
              block_size=4, token_fn=hashed_tokens(0))
    on = run(specs, enable_prefix_caching=True, **kw)
    off = run(specs, **kw)
    assert on.stats.prefix_cache_hits == on.num_hit_tokens == 3 * 12
    assert on.stats.prefix_cache_queries == 4 * 14
    assert on.stats.num_prefill_tokens == 14 + 3 * 2
    assert off.stats.num_prefill_tokens == 4 * 14 and off.stats.prefix_cache_hits == 0
    assert dict(on.outputs) == dict(off.outputs)


def test_requests_admitted_in_one_step_share_the_prefix_being_computed():
    specs = shared_prefix_specs(3, prefix_len=8, tail_len=3, arrival_gap=0)
    res = run(specs, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=32, num_blocks=40,
              block_size=4, token_fn=hashed_tokens(1), enable_prefix_caching=True)
    first = res.sched_outputs[0]
    assert [n.num_computed_tokens for n in first.scheduled_new_reqs] == [0, 8, 8]
    assert first.scheduled_new_reqs[1].block_ids[0][:2] == first.scheduled_new_reqs[0].block_ids[0][:2]


def test_the_last_token_is_always_recomputed():
    """Two identical prompts of exactly two blocks: the second hits one block, not two."""
    specs = [Spec([3] * 8, SamplingParams(max_tokens=2, ignore_eos=True), arrival_step=i) for i in range(2)]
    res = run(specs, max_num_seqs=2, max_num_batched_tokens=64, max_model_len=32, num_blocks=20,
              block_size=4, token_fn=hashed_tokens(2), enable_prefix_caching=True)
    assert res.num_hit_tokens == 4


def test_cache_salt_separates_prefixes():
    sched = make_scheduler(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=32, num_blocks=20,
                           block_size=4, enable_prefix_caching=True)
    worker = FakeWorker(4, hashed_tokens(3))
    params = SamplingParams(max_tokens=1)
    for i, salt in enumerate([None, "alice", "alice", None]):
        sched.add_request(Request(f"r{i}", [1] * 9, params, None, 0, cache_salt=salt))
        so = sched.schedule()
        sched.update_from_output(so, worker.execute_model(so))
        assert so.scheduled_new_reqs[0].num_computed_tokens == [0, 0, 8, 8][i]


def test_freed_blocks_stay_cached_until_evicted_lru():
    """A finished request's blocks are hit later; under pressure the least recently
    freed (a request's tail blocks first) are reused, and reset_prefix_cache forgets all."""
    sched = make_scheduler(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=32, num_blocks=7,
                           block_size=4, enable_prefix_caching=True)
    worker = FakeWorker(4, hashed_tokens(4))

    def serve(req_id, prompt):
        sched.add_request(Request(req_id, prompt, SamplingParams(max_tokens=1), None, 0))
        so = sched.schedule()
        sched.update_from_output(so, worker.execute_model(so))
        return so.scheduled_new_reqs[0]

    serve("a", [1] * 13)                                  # 4 blocks, 3 full ones cached
    assert serve("b", [1] * 12 + [5]).num_computed_tokens == 12
    serve("c", [2] * 16)                                  # 4 blocks: 2 free + a's 2 tail-most
    assert serve("d", [1] * 9).num_computed_tokens == 8   # a's first two blocks survived
    assert sched.reset_prefix_cache()
    assert serve("e", [1] * 9).num_computed_tokens == 0


def test_swap_keeps_progress_and_falls_back_to_recompute_without_room():
    specs = [Spec([i] * 6, SamplingParams(max_tokens=20, ignore_eos=True)) for i in range(4)]
    kw = dict(max_num_seqs=4, max_num_batched_tokens=32, max_model_len=32, block_size=4,
              num_blocks=cdiv(32, 4) + 1, token_fn=hashed_tokens(5))
    swap = run(specs, preemption_mode="swap", num_swap_blocks=64, **kw)
    assert swap.saw_swap and swap.stats.num_swap_outs == swap.num_preemptions > 0
    resumed = [n for so in swap.sched_outputs for n in so.scheduled_new_reqs if n.output_token_ids]
    assert resumed and all(n.num_computed_tokens > 0 for n in resumed)
    assert sum(len(so.blocks_to_swap_in) for so in swap.sched_outputs) == \
        sum(len(so.blocks_to_swap_out) for so in swap.sched_outputs)
    recompute = run(specs, **kw)
    no_room = run(specs, preemption_mode="swap", num_swap_blocks=0, **kw)
    assert no_room.num_preemptions > 0 and no_room.stats.num_swap_outs == 0
    assert dict(swap.outputs) == dict(recompute.outputs) == dict(no_room.outputs)
    # Swapping saves recomputation: fewer tokens computed in all.
    total = [sum(so.total_num_scheduled_tokens for so in r.sched_outputs) for r in (swap, recompute)]
    assert total[0] < total[1]


def test_aborting_a_swapped_request_frees_its_host_slots():
    sched = make_scheduler(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=16, num_blocks=5,
                           block_size=4, preemption_mode="swap", num_swap_blocks=8)
    worker = FakeWorker(4, hashed_tokens(6))
    for i in range(3):
        sched.add_request(Request(f"r{i}", [1] * 4, SamplingParams(max_tokens=8, ignore_eos=True), None, 0))
    for _ in range(2):
        so = sched.schedule()
        sched.update_from_output(so, worker.execute_model(so))
    assert so.preempted_req_ids == {"r2"} and so.blocks_to_swap_out
    assert sched.make_stats().num_swapped_reqs == 1
    sched.abort_requests(["r2"])
    assert sched.swap_space.get_num_free_slots() == 8
    assert sched.make_stats().num_swapped_reqs == 0


def test_priority_policy_admits_and_preempts_by_priority():
    sched = make_scheduler(max_num_seqs=1, max_num_batched_tokens=64, max_model_len=32, num_blocks=20,
                           block_size=4, scheduling_policy="priority")
    worker = FakeWorker(4, hashed_tokens(7))
    for i, prio in enumerate([2, 0, 1]):
        sched.add_request(Request(f"r{i}", [1] * 3, SamplingParams(max_tokens=1), None, 0,
                                  arrival_time=float(i), priority=prio))
    order = []
    while sched.has_unfinished_requests():
        so = sched.schedule()
        order += [n.req_id for n in so.scheduled_new_reqs]
        sched.update_from_output(so, worker.execute_model(so))
    assert order == ["r1", "r2", "r0"]
    # Under pressure the running request that ranks last is the victim, not the newest.
    sched = make_scheduler(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=16, num_blocks=5,
                           block_size=4, scheduling_policy="priority")
    worker = FakeWorker(4, hashed_tokens(7))
    for i, prio in enumerate([0, 5, 1]):
        sched.add_request(Request(f"r{i}", [1] * 4, SamplingParams(max_tokens=8, ignore_eos=True), None, 0,
                                  arrival_time=float(i), priority=prio))
    so = sched.schedule()
    assert [n.req_id for n in so.scheduled_new_reqs] == ["r0", "r2", "r1"]
    sched.update_from_output(so, worker.execute_model(so))
    assert sched.schedule().preempted_req_ids == {"r1"}


def test_long_prefill_token_threshold_caps_chunks():
    specs = [Spec([1] * 20, SamplingParams(max_tokens=2, ignore_eos=True)),
             Spec([2] * 3, SamplingParams(max_tokens=5, ignore_eos=True))]
    res = run(specs, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=32, num_blocks=20,
              block_size=4, token_fn=hashed_tokens(8), long_prefill_token_threshold=6)
    assert [so.num_scheduled_tokens.get("req-0") for so in res.sched_outputs[:5]] == [6, 6, 6, 2, 1]
    assert res.sched_outputs[0].num_scheduled_tokens["req-1"] == 3


def test_stats_count_running_waiting_usage_and_preemptions():
    sched = make_scheduler(max_num_seqs=2, max_num_batched_tokens=64, max_model_len=32, num_blocks=9,
                           block_size=4)
    for i in range(3):
        sched.add_request(Request(f"r{i}", [1] * 5, SamplingParams(max_tokens=4), None, 0))
    sched.schedule()
    stats = sched.make_stats()
    assert (stats.num_running_reqs, stats.num_waiting_reqs, stats.num_swapped_reqs) == (2, 1, 0)
    assert stats.kv_cache_usage == 4 / 8 and stats.num_preemptions == 0
    assert stats.num_prefill_tokens == 10 and stats.prefix_cache_hit_rate == 0.0
    assert RequestStatus.is_finished(RequestStatus.FINISHED_IGNORED)
    assert not RequestStatus.is_finished(RequestStatus.SWAPPED)
