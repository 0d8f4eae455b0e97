"""Scheduler tests driven by the fake model loop of sched_harness: random workloads
(hypothesis) and targeted cases of chunking, preemption, finishing and aborts."""
from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from sched_harness import LENGTH, STOP, FakeWorker, Spec, check_final, hashed_tokens, make_scheduler, run, scenarios

from jaxvllm.core.kv_cache_manager import cdiv
from jaxvllm.core.request import Request, RequestStatus
from jaxvllm.outputs import FinishReason
from jaxvllm.sampling_params import SamplingParams


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_random_workloads_keep_invariants_and_finish_correctly(scenario):
    cfg, specs, aborts, seed = scenario
    token_fn = hashed_tokens(seed)
    res = run(specs, token_fn=token_fn, aborts=aborts, **cfg)
    check_final(specs, res, cfg["max_model_len"], token_fn)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(with_aborts=False))
def test_outputs_do_not_depend_on_pool_size_or_batching(scenario):
    """The smallest legal pool (preempting) and an unconstrained run give the same tokens."""
    cfg, specs, _, seed = scenario
    token_fn = hashed_tokens(seed)
    tiny = dict(cfg, num_blocks=cdiv(cfg["max_model_len"], cfg["block_size"]) + 1)
    roomy = dict(cfg, num_blocks=len(specs) * cdiv(cfg["max_model_len"], cfg["block_size"]) + 1,
                 max_num_seqs=len(specs), max_num_batched_tokens=len(specs) * cfg["max_model_len"])
    a = run(specs, token_fn=token_fn, **tiny)
    b = run(specs, token_fn=token_fn, **roomy)
    assert b.num_preemptions == 0
    assert dict(a.outputs) == dict(b.outputs)
    assert a.finish == b.finish
    check_final(specs, a, cfg["max_model_len"], token_fn)


# ---- targeted tests ----------------------------------------------------------------------
def scripted(streams: dict[str, list[int]], default: int = 5):
    """A fake model that emits a fixed stream per request (then `default`)."""
    positions: dict[str, int] = {}

    def token_fn(req_id: str, pos: int) -> int:
        start = positions.setdefault(req_id, pos)
        stream = streams.get(req_id, [])
        k = pos - start
        return stream[k] if k < len(stream) else default
    return token_fn


def simple_specs(*prompt_lens, **params):
    return [Spec(prompt=[3] * n, params=SamplingParams(**params)) for n in prompt_lens]


def test_chunked_prefill_splits_a_long_prompt():
    token_fn = hashed_tokens(0)
    specs = simple_specs(20, max_tokens=3, ignore_eos=True)
    res = run(specs, max_num_seqs=4, max_num_batched_tokens=8, max_model_len=64, num_blocks=40,
              block_size=4, token_fn=token_fn)
    log = res.sched_outputs
    assert [so.num_scheduled_tokens.get("req-0") for so in log[:5]] == [8, 8, 4, 1, 1]
    assert [n.req_id for n in log[0].scheduled_new_reqs] == ["req-0"]
    assert log[1].scheduled_cached_reqs.req_ids == ["req-0"]
    assert log[1].scheduled_cached_reqs.num_computed_tokens == [8]
    assert log[2].scheduled_cached_reqs.num_computed_tokens == [16]
    assert len(log[0].scheduled_new_reqs[0].block_ids[0]) == 2  # 8 tokens in blocks of 4
    assert [len(b[0]) for b in log[1].scheduled_cached_reqs.new_block_ids] == [2]
    assert [len(b[0]) for b in log[2].scheduled_cached_reqs.new_block_ids] == [1]
    # The first decode (position 20) opens a sixth block; the next (21) fits in it.
    assert [len(b[0]) for b in log[3].scheduled_cached_reqs.new_block_ids] == [1]
    assert log[4].scheduled_cached_reqs.new_block_ids == [([],)]
    assert res.saw_chunked_prefill
    assert res.outputs["req-0"] == [token_fn("req-0", p) for p in (20, 21, 22)]
    assert res.finish["req-0"] == (FinishReason.LENGTH, None)


def test_decodes_and_prefill_chunks_share_a_step():
    token_fn = hashed_tokens(1)
    specs = [Spec(prompt=[1] * 4, params=SamplingParams(max_tokens=10, ignore_eos=True)),
             Spec(prompt=[2] * 30, params=SamplingParams(max_tokens=2, ignore_eos=True),
                  arrival_step=2)]
    res = run(specs, max_num_seqs=4, max_num_batched_tokens=10, max_model_len=64, num_blocks=40,
              block_size=4, token_fn=token_fn)
    step2 = res.sched_outputs[2].num_scheduled_tokens
    assert step2 == {"req-0": 1, "req-1": 9}  # a decode and the first prefill chunk
    step3 = res.sched_outputs[3].num_scheduled_tokens
    assert step3 == {"req-0": 1, "req-1": 9}
    assert res.saw_mixed_step and res.saw_chunked_prefill
    check_final(specs, res, 64, token_fn)


def test_max_num_seqs_bounds_the_running_set():
    token_fn = hashed_tokens(2)
    specs = simple_specs(3, 3, 3, 3, 3, max_tokens=4, ignore_eos=True)
    res = run(specs, max_num_seqs=2, max_num_batched_tokens=100, max_model_len=32, num_blocks=40,
              block_size=4, token_fn=token_fn)
    assert set(res.sched_outputs[0].num_scheduled_tokens) == {"req-0", "req-1"}
    assert max(len(so.num_scheduled_tokens) for so in res.sched_outputs) == 2
    check_final(specs, res, 32, token_fn)


def test_tiny_pool_preempts_and_outputs_match_unconstrained_run():
    token_fn = hashed_tokens(3)
    specs = [Spec(prompt=[i] * 6, params=SamplingParams(max_tokens=20, ignore_eos=True))
             for i in range(4)]
    kw = dict(max_num_seqs=4, max_num_batched_tokens=32, max_model_len=32, block_size=4,
              token_fn=token_fn)
    tiny = run(specs, num_blocks=cdiv(32, 4) + 1, **kw)
    roomy = run(specs, num_blocks=4 * 8 + 1, **kw)
    assert tiny.num_preemptions > 0
    assert roomy.num_preemptions == 0
    preempted = {rid for rid, r in tiny.requests.items() if r.num_preemptions > 0}
    assert preempted
    # Preempted requests were resumed as new requests carrying their earlier outputs.
    resumed = [n for so in tiny.sched_outputs for n in so.scheduled_new_reqs if n.output_token_ids]
    assert {n.req_id for n in resumed} <= preempted and resumed
    assert any(so.preempted_req_ids for so in tiny.sched_outputs)
    assert dict(tiny.outputs) == dict(roomy.outputs)
    assert tiny.finish == roomy.finish == {f"req-{i}": (LENGTH, None) for i in range(4)}
    check_final(specs, tiny, 32, token_fn)


def test_preemption_frees_blocks_and_requeues_at_front():
    sched = make_scheduler(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=16,
                           num_blocks=5, block_size=4)  # 4 usable blocks
    reqs = [Request(f"r{i}", [1] * 4, SamplingParams(max_tokens=8, ignore_eos=True), None, 0)
            for i in range(3)]
    for r in reqs:
        sched.add_request(r)
    worker = FakeWorker(4, hashed_tokens(4))
    so = sched.schedule()  # three prompts of exactly one block each
    assert so.num_scheduled_tokens == {"r0": 4, "r1": 4, "r2": 4}
    sched.update_from_output(so, worker.execute_model(so))
    # Each decode needs a second block and one is free: r0 takes it, r1 preempts r2 (the
    # newest) and takes the block r2 gave back.
    so = sched.schedule()
    assert so.preempted_req_ids == {"r2"}
    assert so.num_scheduled_tokens == {"r0": 1, "r1": 1}
    assert reqs[2].status == RequestStatus.PREEMPTED and reqs[2].num_computed_tokens == 0
    assert reqs[2].output_token_ids  # keeps its sampled token
    assert list(sched.waiting) == [reqs[2]]
    assert sched.kv_cache_manager.get_block_ids("r2") == ([],)
    assert sched.num_preemptions == 1 and reqs[2].num_preemptions == 1


P = SamplingParams

# name: (prompt length, params, eos, scripted tokens, expected (tokens, reason, stop_reason))
FINISH_CASES = {
    "eos stops": (3, P(max_tokens=10), 2, [4, 2, 4], ([4, 2], STOP, None)),
    "ignore_eos": (3, P(max_tokens=4, ignore_eos=True), 2, [2] * 5, ([2] * 4, LENGTH, None)),
    "eos waits for min_tokens": (3, P(max_tokens=10, min_tokens=3), 2, [2, 6, 2, 2],
                                 ([2, 6, 2], STOP, None)),
    "stop token sets stop_reason": (3, P(max_tokens=10, stop_token_ids=[6, 7]), 2, [4, 7, 4],
                                    ([4, 7], STOP, 7)),
    "stop token waits for min_tokens": (3, P(max_tokens=10, min_tokens=2, stop_token_ids=[6]),
                                        None, [6, 6], ([6, 6], STOP, 6)),
    "stop token despite ignore_eos": (3, P(max_tokens=10, ignore_eos=True, stop_token_ids=[2]),
                                      2, [4, 2], ([4, 2], STOP, 2)),
    "max_tokens wins over eos": (3, P(max_tokens=2), 2, [4, 2], ([4, 2], LENGTH, None)),
    "max_model_len caps": (28, P(max_tokens=None), None, [], ([5] * 4, LENGTH, None)),
}


def test_finish_reasons():
    names = list(FINISH_CASES)
    specs = [Spec([1] * FINISH_CASES[n][0], FINISH_CASES[n][1], eos=FINISH_CASES[n][2])
             for n in names]
    token_fn = scripted({f"req-{i}": FINISH_CASES[n][3] for i, n in enumerate(names)})
    res = run(specs, max_num_seqs=8, max_num_batched_tokens=64, max_model_len=32,
              num_blocks=80, block_size=4, token_fn=token_fn)
    for i, name in enumerate(names):
        want_tokens, reason, stop_reason = FINISH_CASES[name][4]
        assert res.outputs[f"req-{i}"] == want_tokens, name
        assert res.finish[f"req-{i}"] == (reason, stop_reason), name
        assert res.requests[f"req-{i}"].stop_reason == stop_reason, name


def test_abort_waiting_and_running_requests():
    sched = make_scheduler(max_num_seqs=1, max_num_batched_tokens=64, max_model_len=32,
                           num_blocks=20, block_size=4)
    a = Request("a", [1] * 5, SamplingParams(max_tokens=10, ignore_eos=True), None, 0)
    b = Request("b", [1] * 5, SamplingParams(max_tokens=10, ignore_eos=True), None, 0)
    sched.add_request(a)
    sched.add_request(b)
    worker = FakeWorker(4, hashed_tokens(5))
    so = sched.schedule()
    assert set(so.num_scheduled_tokens) == {"a"}
    sched.update_from_output(so, worker.execute_model(so))
    # b never reached the worker: aborting it reports nothing to the worker.
    sched.finish_requests(["b"], RequestStatus.FINISHED_ABORTED)
    assert b.status == RequestStatus.FINISHED_ABORTED and b.get_finished_reason() == FinishReason.ABORT
    # a is running: its blocks are freed at once, and the worker hears about it once.
    sched.finish_requests(["a", "unknown-id"], RequestStatus.FINISHED_ABORTED)
    assert sched.kv_cache_manager.block_pool.get_num_free_blocks() == 19
    assert not sched.has_unfinished_requests()
    so = sched.schedule()
    assert so.finished_req_ids == {"a"}
    assert so.total_num_scheduled_tokens == 0
    worker.execute_model(so)
    assert worker.reqs == {}
    assert sched.schedule().finished_req_ids == set()
    # Aborting again is a no-op.
    sched.finish_requests(["a", "b"], RequestStatus.FINISHED_ABORTED)
    assert a.status == b.status == RequestStatus.FINISHED_ABORTED


def test_finished_ids_reported_once_after_normal_finish():
    sched = make_scheduler(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=32,
                           num_blocks=20, block_size=4)
    sched.add_request(Request("a", [1] * 3, SamplingParams(max_tokens=1), None, 0))
    worker = FakeWorker(4, hashed_tokens(6))
    so = sched.schedule()
    outs = sched.update_from_output(so, worker.execute_model(so))
    assert len(outs) == 1 and outs[0].finish_reason == FinishReason.LENGTH
    assert sched.kv_cache_manager.block_pool.get_num_free_blocks() == 19
    assert sched.schedule().finished_req_ids == {"a"}
    assert sched.schedule().finished_req_ids == set()


def test_output_for_a_request_aborted_mid_step_is_dropped():
    """A token coming back for a request aborted after schedule() is ignored."""
    sched = make_scheduler(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=32,
                           num_blocks=20, block_size=4)
    a = Request("a", [1] * 3, SamplingParams(max_tokens=5), None, 0)
    sched.add_request(a)
    worker = FakeWorker(4, hashed_tokens(7))
    so = sched.schedule()
    ro = worker.execute_model(so)
    sched.finish_requests(["a"], RequestStatus.FINISHED_ABORTED)
    assert sched.update_from_output(so, ro) == []
    assert a.output_token_ids == []
    assert sched.kv_cache_manager.block_pool.get_num_free_blocks() == 19
