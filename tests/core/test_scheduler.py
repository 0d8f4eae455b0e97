"""Scheduler, driven by a fake model loop: schedule() -> fake worker -> update_from_output().

The fake worker keeps its own per-request state built only from `SchedulerOutput` (as the
real model runner does), so the tests check the scheduler/worker protocol as well as the
scheduler's bookkeeping. Its "model" is deterministic: the token sampled at position p of
request r is a function of (r, p). So outputs must not depend on batching, chunking or
preemption, and a plain reference loop gives the expected tokens and finish reason.
"""
from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import dataclass, field

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxvllm.core.kv_cache_manager import cdiv
from jaxvllm.core.request import Request, RequestStatus
from jaxvllm.core.sched_output import ModelRunnerOutput, SchedulerOutput
from jaxvllm.core.scheduler import Scheduler
from jaxvllm.engine.messages import FinishReason
from jaxvllm.sampling_params import SamplingParams

VOCAB = 8  # small, so eos and stop tokens turn up often in the random stream
STOP, LENGTH = FinishReason.STOP, FinishReason.LENGTH


def hashed_tokens(seed: int):
    """Token at position `pos` of request `req_id`: a fixed pseudo-random function."""
    def token(req_id: str, pos: int) -> int:
        return random.Random(f"{seed}/{req_id}/{pos}").randrange(VOCAB)
    return token


# ---- the fake worker -------------------------------------------------------------------
@dataclass
class WorkerReq:
    token_ids: list[int]
    num_computed_tokens: int
    block_ids: list[int]


class FakeWorker:
    """Holds what a model runner would hold, and checks every message it receives."""

    def __init__(self, block_size: int, token_fn):
        self.block_size = block_size
        self.token_fn = token_fn
        self.reqs: dict[str, WorkerReq] = {}

    def execute_model(self, so: SchedulerOutput) -> ModelRunnerOutput:
        # Drop state first: finished ids are each reported exactly once, for a request the
        # worker holds; preempted ones come back later as new requests.
        for req_id in so.finished_req_ids | so.preempted_req_ids:
            assert req_id in self.reqs, f"{req_id} dropped but the worker never held it"
            del self.reqs[req_id]
        assert not (so.finished_req_ids & so.preempted_req_ids)
        for new in so.scheduled_new_reqs:
            assert new.req_id not in self.reqs, f"{new.req_id} sent as new twice"
            assert new.num_computed_tokens == 0  # no prefix caching: recompute from zero
            assert 0 not in new.block_ids
            tokens = list(new.prompt_token_ids) + list(new.output_token_ids)
            self.reqs[new.req_id] = WorkerReq(tokens, new.num_computed_tokens, list(new.block_ids))
        cached = so.scheduled_cached_reqs
        assert len(cached.req_ids) == len(cached.new_block_ids) == len(cached.num_computed_tokens)
        for req_id, new_blocks, num_computed in zip(cached.req_ids, cached.new_block_ids,
                                                    cached.num_computed_tokens):
            assert req_id in self.reqs, f"{req_id} sent as cached but the worker does not hold it"
            state = self.reqs[req_id]
            assert num_computed == state.num_computed_tokens
            assert 0 not in new_blocks
            state.block_ids.extend(new_blocks)
        new_ids = [n.req_id for n in so.scheduled_new_reqs]
        assert len(set(new_ids) | set(cached.req_ids)) == len(new_ids) + len(cached.req_ids)
        assert set(so.num_scheduled_tokens) == set(new_ids) | set(cached.req_ids)

        req_ids, sampled = [], []
        for req_id, n in so.num_scheduled_tokens.items():
            state = self.reqs[req_id]
            end = state.num_computed_tokens + n
            assert end <= len(state.token_ids), "scheduled tokens the worker does not have"
            assert len(state.block_ids) * self.block_size >= end, "block table too short"
            state.num_computed_tokens = end
            req_ids.append(req_id)
            if end == len(state.token_ids):
                tok = self.token_fn(req_id, len(state.token_ids))
                state.token_ids.append(tok)
                sampled.append([tok])
            else:
                sampled.append([])  # partial prefill chunk: nothing sampled
        return ModelRunnerOutput(req_ids=req_ids, sampled_token_ids=sampled)


# ---- the reference ---------------------------------------------------------------------
def reference(prompt_len: int, params: SamplingParams, eos: int | None, max_model_len: int,
              req_id: str, token_fn):
    """Tokens, finish reason and stop reason of one request run alone, step by step."""
    out: list[int] = []
    while True:
        tok = token_fn(req_id, prompt_len + len(out))
        out.append(tok)
        if (prompt_len + len(out) >= max_model_len
                or (params.max_tokens is not None and len(out) >= params.max_tokens)):
            return out, FinishReason.LENGTH, None
        if len(out) < params.min_tokens:
            continue
        if not params.ignore_eos and tok == eos:
            return out, FinishReason.STOP, None
        if tok in params.stop_token_ids:
            return out, FinishReason.STOP, tok


# ---- the engine loop with invariant checks ---------------------------------------------
@dataclass
class Spec:
    prompt: list[int]
    params: SamplingParams
    eos: int | None = None
    arrival_step: int = 0


@dataclass
class RunResult:
    requests: dict[str, Request]
    outputs: dict[str, list[int]]
    finish: dict[str, tuple[FinishReason, object]]
    aborted: set[str]
    num_steps: int
    num_preemptions: int
    saw_chunked_prefill: bool = False
    saw_mixed_step: bool = False
    sched_outputs: list[SchedulerOutput] = field(default_factory=list)


def run(specs: list[Spec], *, max_num_seqs: int, max_num_batched_tokens: int, max_model_len: int,
        num_blocks: int, block_size: int, token_fn, aborts=(),
        max_steps: int = 20_000) -> RunResult:
    """Drive a Scheduler to completion, checking its invariants after every call.

    `aborts` is a list of (step, request index, mid_step): that request is aborted right
    before that step's schedule(), or between its schedule() and update_from_output() when
    mid_step (a no-op when it already finished or has not arrived).
    """
    sched = Scheduler(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                      max_model_len=max_model_len, num_blocks=num_blocks, block_size=block_size)
    worker = FakeWorker(block_size, token_fn)
    pool = sched.kv_cache_manager.block_pool
    ids = [f"req-{i}" for i in range(len(specs))]
    requests: dict[str, Request] = {}
    outputs: dict[str, list[int]] = defaultdict(list)
    finish: dict[str, tuple[FinishReason, object]] = {}
    aborted: set[str] = set()
    aborts_at = defaultdict(list)
    for step, idx, mid_step in aborts:
        aborts_at[step, mid_step].append(ids[idx])

    def abort(step: int, mid_step: bool) -> None:
        for req_id in aborts_at.get((step, mid_step), []):
            if req_id not in requests:
                continue
            req = requests[req_id]
            was_live = not req.is_finished()
            status_before = req.status
            sched.finish_requests([req_id], RequestStatus.FINISHED_ABORTED)
            if was_live:
                aborted.add(req_id)
                assert req.status == RequestStatus.FINISHED_ABORTED
                assert req_id not in sched.requests
                assert sched.kv_cache_manager.get_block_ids(req_id) == []
            else:
                assert req.status == status_before  # aborting a finished request changes nothing
        check_state(sched, requests)
    result = RunResult(requests, outputs, finish, aborted, 0, 0)
    last_arrival = max((s.arrival_step for s in specs), default=0)

    step = 0
    while step <= last_arrival or sched.has_unfinished_requests():
        assert step < max_steps, "scheduler made no progress"
        for req_id, spec in zip(ids, specs):
            if spec.arrival_step == step:
                req = Request(request_id=req_id, prompt_token_ids=list(spec.prompt),
                              sampling_params=spec.params, eos_token_id=spec.eos, sampling_seed=0)
                requests[req_id] = req
                sched.add_request(req)
        abort(step, mid_step=False)

        had_work = sched.has_unfinished_requests()
        running_before = [r.request_id for r in sched.running]
        waiting_before = [r.request_id for r in sched.waiting]
        computed_before = {rid: r.num_computed_tokens for rid, r in requests.items()}
        so = sched.schedule()
        result.sched_outputs.append(so)
        check_schedule(sched, so, requests, running_before, waiting_before, computed_before,
                       had_work, result)
        check_state(sched, requests)

        ro = worker.execute_model(so)
        for rid in so.num_scheduled_tokens:  # the worker's block tables match the scheduler's
            assert worker.reqs[rid].block_ids == sched.kv_cache_manager.get_block_ids(rid)
        sampled = dict(zip(ro.req_ids, ro.sampled_token_ids))
        abort(step, mid_step=True)  # tokens sampled for these must be dropped
        engine_outputs = sched.update_from_output(so, ro)
        seen = set()
        for out in engine_outputs:
            rid = out.request_id
            assert rid not in seen and rid not in finish
            seen.add(rid)
            assert out.new_token_ids == sampled[rid] and len(out.new_token_ids) == 1
            outputs[rid].extend(out.new_token_ids)
            assert outputs[rid] == requests[rid].output_token_ids
            if out.finished:
                finish[rid] = (out.finish_reason, out.stop_reason)
                assert requests[rid].is_finished()
            else:
                assert requests[rid].status == RequestStatus.RUNNING
        # Every request that sampled a token got exactly one output.
        assert seen == {rid for rid, toks in sampled.items() if toks and rid not in aborted}
        # The worker and the scheduler agree on every running request's tokens.
        for req in sched.running:
            if req.request_id in worker.reqs:
                assert worker.reqs[req.request_id].token_ids == req.all_token_ids
        check_state(sched, requests)
        step += 1

    # One more step flushes the last finished ids to the worker.
    so = sched.schedule()
    assert so.total_num_scheduled_tokens == 0 and not so.scheduled_new_reqs
    worker.execute_model(so)
    assert worker.reqs == {}, "finished requests never reported to the worker"
    assert sched.schedule().finished_req_ids == set()
    assert pool.get_num_free_blocks() == num_blocks - 1
    assert sched.kv_cache_manager.req_to_blocks == {}
    assert sched.requests == {} and not sched.running and not sched.waiting
    assert all(b.ref_cnt == 0 for b in pool.blocks[1:])
    result.num_steps = step
    result.num_preemptions = sched.num_preemptions
    return result


def check_state(sched: Scheduler, requests: dict[str, Request]) -> None:
    """Bookkeeping that must hold between any two calls."""
    bs = sched.kv_cache_manager.block_size
    assert len(sched.running) <= sched.max_num_seqs
    running = {r.request_id for r in sched.running}
    waiting = {r.request_id for r in sched.waiting}
    assert len(running) == len(sched.running) and len(waiting) == len(sched.waiting)
    assert not running & waiting
    assert running | waiting == set(sched.requests)
    owned: list[int] = []
    for rid, req in requests.items():
        if req.is_finished():
            assert rid not in sched.requests
            assert sched.kv_cache_manager.get_block_ids(rid) == []
            continue
        assert sched.requests[rid] is req
        if rid in running:
            assert req.status == RequestStatus.RUNNING
        else:
            assert req.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED)
            assert req.num_computed_tokens == 0
        assert req.num_tokens <= sched.max_model_len
        assert req.num_computed_tokens <= min(req.num_tokens, sched.max_model_len - 1)
        blocks = sched.kv_cache_manager.get_block_ids(rid)
        # The table covers the computed tokens, and holds nothing beyond them.
        assert len(blocks) == cdiv(req.num_computed_tokens, bs)
        owned.extend(blocks)
    assert 0 not in owned, "the null block was handed to a request"
    assert len(owned) == len(set(owned)), "a block is owned by two live requests"
    pool = sched.kv_cache_manager.block_pool
    assert pool.get_num_free_blocks() == pool.num_blocks - 1 - len(owned)
    assert all(pool.blocks[b].ref_cnt == 1 for b in owned)


def check_schedule(sched, so, requests, running_before, waiting_before, computed_before,
                   had_work, result) -> None:
    n_sched = so.num_scheduled_tokens
    assert so.total_num_scheduled_tokens == sum(n_sched.values())
    assert so.total_num_scheduled_tokens <= sched.max_num_batched_tokens
    assert all(n > 0 for n in n_sched.values())
    assert len(n_sched) <= sched.max_num_seqs
    assert set(n_sched) <= {r.request_id for r in sched.running}
    if had_work:
        assert so.total_num_scheduled_tokens > 0, "unfinished requests but nothing scheduled"
    # Ids sent as cached were held by the worker before; ids sent as new were not running.
    for rid in so.scheduled_cached_reqs.req_ids:
        assert rid in running_before
    for new in so.scheduled_new_reqs:
        assert new.req_id in waiting_before
        req = requests[new.req_id]
        assert list(new.prompt_token_ids) + list(new.output_token_ids) == req.all_token_ids
        assert new.block_ids == sched.kv_cache_manager.get_block_ids(new.req_id)
    # Waiting requests are admitted in queue order.
    admitted = [n.req_id for n in so.scheduled_new_reqs]
    assert admitted == waiting_before[:len(admitted)]
    # Preemption: newest running requests go, to the front of the queue, recomputed; a step
    # that preempts admits nobody.
    if so.preempted_req_ids:
        assert not so.scheduled_new_reqs
        victims = [rid for rid in running_before if rid in so.preempted_req_ids]
        assert victims == running_before[len(running_before) - len(victims):]
        assert [r.request_id for r in sched.waiting][:len(victims)] == victims  # order kept
        for rid in victims:
            assert requests[rid].status == RequestStatus.PREEMPTED
            assert rid not in n_sched
    for rid in so.preempted_req_ids:
        assert rid in running_before
    for rid in so.finished_req_ids:
        assert requests[rid].is_finished()
    # Running requests come first: if anyone was admitted, every running request that was
    # not preempted got tokens.
    if admitted:
        for rid in running_before:
            assert rid in n_sched
    # Chunked prefill: a request gets fewer tokens than it has left only when the step's
    # budget is spent.
    decode = prefill = False
    for rid, n in n_sched.items():
        req = requests[rid]
        remaining = req.num_tokens - computed_before[rid]
        assert n <= remaining
        assert req.num_computed_tokens == computed_before[rid] + n
        if n < remaining:
            assert so.total_num_scheduled_tokens == sched.max_num_batched_tokens
            result.saw_chunked_prefill = True
        if computed_before[rid] >= req.num_prompt_tokens:
            decode = True
        else:
            prefill = True
    if decode and prefill:
        result.saw_mixed_step = True


def check_final(specs, res: RunResult, max_model_len: int, token_fn) -> None:
    for i, spec in enumerate(specs):
        rid = f"req-{i}"
        req = res.requests[rid]
        assert req.is_finished()
        want, reason, stop_reason = reference(len(spec.prompt), spec.params, spec.eos,
                                              max_model_len, rid, token_fn)
        got = res.outputs.get(rid, [])
        assert got == req.output_token_ids
        if rid in res.aborted:
            assert req.status == RequestStatus.FINISHED_ABORTED
            assert rid not in res.finish  # aborts are reported by the engine, not here
            assert got == want[:len(got)] and len(got) < len(want)
            continue
        assert got == want, f"{rid}: outputs differ from the fake model's stream"
        assert res.finish[rid] == (reason, stop_reason)
        assert req.stop_reason == stop_reason
        assert len(spec.prompt) + len(got) <= max_model_len
        if reason == FinishReason.LENGTH:
            assert req.status == RequestStatus.FINISHED_LENGTH_CAPPED
            assert (len(got) == spec.params.max_tokens
                    or len(spec.prompt) + len(got) == max_model_len)
        else:
            assert req.status == RequestStatus.FINISHED_STOPPED
            assert len(got) >= spec.params.min_tokens
            if stop_reason is None:
                assert got[-1] == spec.eos and not spec.params.ignore_eos
            else:
                assert got[-1] == stop_reason in spec.params.stop_token_ids


# ---- property tests ------------------------------------------------------------------
@st.composite
def scenarios(draw, with_aborts=True):
    block_size = draw(st.sampled_from([1, 2, 3, 4, 8, 16]))
    max_model_len = draw(st.integers(2, 48))
    min_blocks = cdiv(max_model_len, block_size) + 1  # any single request fits
    num_blocks = draw(st.integers(min_blocks, min_blocks + 10))
    cfg = dict(max_num_seqs=draw(st.integers(1, 6)),
               max_num_batched_tokens=draw(st.integers(1, 40)),
               max_model_len=max_model_len, num_blocks=num_blocks, block_size=block_size)
    specs = []
    for _ in range(draw(st.integers(1, 8))):
        prompt_len = draw(st.integers(1, max_model_len - 1))
        max_tokens = draw(st.none() | st.integers(1, max_model_len))
        min_tokens = draw(st.integers(0, max_tokens if max_tokens is not None else 8))
        params = SamplingParams(
            max_tokens=max_tokens, min_tokens=min_tokens, ignore_eos=draw(st.booleans()),
            stop_token_ids=draw(st.lists(st.integers(0, VOCAB + 1), max_size=3)))
        specs.append(Spec(prompt=[7] * prompt_len, params=params,
                          eos=draw(st.sampled_from([None, 0, 1])),
                          arrival_step=draw(st.integers(0, 12))))
    aborts = []
    if with_aborts:
        aborts = draw(st.lists(st.tuples(st.integers(0, 40), st.integers(0, len(specs) - 1),
                                         st.booleans()),
                               max_size=4))
    return cfg, specs, aborts, draw(st.integers(0, 2**16))


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
    assert len(log[0].scheduled_new_reqs[0].block_ids) == 2  # 8 tokens in blocks of 4
    assert [len(b) for b in log[1].scheduled_cached_reqs.new_block_ids] == [2]
    assert [len(b) for b in log[2].scheduled_cached_reqs.new_block_ids] == [1]
    # The first decode (position 20) opens a sixth block; the next (21) fits in it.
    assert [len(b) for b in log[3].scheduled_cached_reqs.new_block_ids] == [1]
    assert log[4].scheduled_cached_reqs.new_block_ids == [[]]
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
    sched = Scheduler(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=16,
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
    assert sched.kv_cache_manager.get_block_ids("r2") == []
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
    sched = Scheduler(max_num_seqs=1, max_num_batched_tokens=64, max_model_len=32,
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
    assert b.status == RequestStatus.FINISHED_ABORTED and b.get_finished_reason() == "abort"
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
    sched = Scheduler(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=32,
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
    sched = Scheduler(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=32,
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
