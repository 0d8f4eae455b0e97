"""Pipeline parallelism's batch queue on the host (engine/batch_queue.py with the scheduler's
max_concurrent_batches): batch n + 1 is scheduled before batch n's tokens are back, never
with a request of a batch in flight, and each batch holds at most its share of max_num_seqs;
the tokens are those of one request run alone and every block returns to the pool, through
preemptions (of requests in flight too) and aborts. The fake worker
of sched_harness runs each batch when it is dispatched, as the device does, in order."""
from __future__ import annotations

from collections import defaultdict

from hypothesis import HealthCheck, given, settings
from sched_harness import FakeWorker, hashed_tokens, make_scheduler, reference, scenarios

from jaxvllm.core.request import Request, RequestStatus
from jaxvllm.engine.batch_queue import BatchQueue
from jaxvllm.sampling_params import SamplingParams


def run_queued(specs, aborts, size: int, token_fn, **cfg):
    sched = make_scheduler(**cfg, max_concurrent_batches=size)
    worker, queue = FakeWorker(cfg["block_size"], token_fn), BatchQueue(size)
    ids = [f"req-{i}" for i in range(len(specs))]
    requests, outputs, aborted = {}, defaultdict(list), set()

    def dispatch():
        so = sched.schedule()
        in_flight = {r for batch, _ in queue.batches for r in batch.num_scheduled_tokens}
        assert not in_flight & set(so.num_scheduled_tokens), "a request in two batches in flight"
        assert len(so.num_scheduled_tokens) <= -(-cfg["max_num_seqs"] // size)
        return so, worker.execute_model(so)

    def finish(batch):
        return sched.update_from_output(*batch)

    step, last = 0, max(s.arrival_step for s in specs)
    while step <= last or sched.has_unfinished_requests() or len(queue):
        assert step < 20_000, "no progress"
        for req_id, spec in zip(ids, specs):
            if spec.arrival_step == step:
                requests[req_id] = Request(req_id, list(spec.prompt), spec.params, spec.eos, 0)
                sched.add_request(requests[req_id])
        for abort_step, i, _ in aborts:
            if abort_step == step and ids[i] in sched.requests:
                sched.finish_requests([ids[i]], RequestStatus.FINISHED_ABORTED)
                aborted.add(ids[i])
        for out in queue.step(sched, dispatch, finish):
            outputs[out.request_id] += out.new_token_ids
        step += 1
    return sched, requests, outputs, aborted, queue.max_in_flight


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_batches_in_flight_give_the_tokens_of_requests_run_alone(scenario):
    cfg, specs, aborts, seed = scenario
    token_fn = hashed_tokens(seed)
    for size in (2, 3):
        sched, requests, outputs, aborted, _ = run_queued(specs, aborts, size, token_fn, **cfg)
        for req_id, request in requests.items():
            want, _, _ = reference(len(request.prompt_token_ids), request.sampling_params, request.eos_token_id,
                                   cfg["max_model_len"], req_id, token_fn)
            got = outputs[req_id]
            assert got == (want[:len(got)] if req_id in aborted else want), req_id
        pool = sched.kv_cache_manager.block_pool
        assert pool.get_num_free_blocks() == cfg["num_blocks"] - 1
        assert not sched.requests and not sched.in_flight.req_ids


def test_in_flight_requests_are_not_scheduled_and_one_preempted_waits_for_its_token():
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    sched = make_scheduler(max_num_seqs=4, max_num_batched_tokens=16, max_model_len=16, num_blocks=5,
                           block_size=4, max_concurrent_batches=2)  # 4 usable blocks, 2 requests a batch
    worker = FakeWorker(4, hashed_tokens(8))

    def dispatch():
        so = sched.schedule()
        return so, worker.execute_model(so)

    for i in range(4):
        sched.add_request(Request(f"r{i}", [1] * 4, params, None, 0))
    b1, b2 = dispatch(), dispatch()  # r0 and r1 are in flight: b2 takes the other two
    assert b1[0].num_scheduled_tokens == {"r0": 4, "r1": 4} and b2[0].num_scheduled_tokens == {"r2": 4, "r3": 4}
    assert dispatch()[0].total_num_scheduled_tokens == 0  # every request is in flight
    sched.update_from_output(*b1)
    # r0's and r1's decodes need a block each: the newest are preempted, in flight as they are.
    b3 = dispatch()
    assert b3[0].preempted_req_ids == {"r2", "r3"} and b3[0].num_scheduled_tokens == {"r0": 1, "r1": 1}
    assert [r.request_id for r in sched.waiting] == ["r2", "r3"]
    sched.finish_requests(["r1"], RequestStatus.FINISHED_ABORTED)  # in flight: frees its 2 blocks
    assert dispatch()[0].total_num_scheduled_tokens == 0  # r2 resumes only with its token back
    assert [o.request_id for o in sched.update_from_output(*b2)] == ["r2", "r3"]
    assert dispatch()[0].num_scheduled_tokens == {"r2": 5}  # recomputed, its token included
    sched.update_from_output(*b3)
    assert sched.requests["r0"].output_token_ids == worker.reqs["r0"].token_ids[4:]
