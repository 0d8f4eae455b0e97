"""Test harness: a Scheduler driven by a fake model loop, schedule() -> fake worker ->
update_from_output(), with every invariant checked after every call.

The fake worker keeps its own per-request state built only from `SchedulerOutput` (as the
real model runner does), so the tests check the scheduler/worker protocol as well as the
scheduler's bookkeeping. Its "model" is deterministic: the token sampled at position p of
request r is a function of (r, p). So outputs must not depend on batching, chunking or
preemption, and a plain reference loop gives the expected tokens and finish reason.

The fake worker also simulates the paged KV cache: each slot it computes holds a key of
the whole prefix up to that position (and the KV cache group), swap-outs and swap-ins copy
block contents, and before sampling it checks every slot the request attends to (in a
sliding-window group, only the window). A prefix-cache hit on the wrong block, a block
reused while still needed, or a botched swap shows up as a wrong key.
"""
from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import dataclass, field

from hypothesis import strategies as st

from jaxvllm.config import CacheConfig, SchedulerConfig
from jaxvllm.config.engine_config import EngineConfig, KVTransferConfig
from jaxvllm.core.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec, KVCacheSpec
from jaxvllm.core.kv_cache_manager import cdiv
from jaxvllm.core.request import Request, RequestStatus
from jaxvllm.core.sched_output import SchedulerOutput
from jaxvllm.core.scheduler import Scheduler
from jaxvllm.outputs import FinishReason, ModelRunnerOutput
from jaxvllm.sampling_params import SamplingParams

VOCAB = 8  # small, so eos and stop tokens turn up often in the random stream
STOP, LENGTH = FinishReason.STOP, FinishReason.LENGTH


def make_scheduler(*, max_num_seqs: int, max_num_batched_tokens: int, max_model_len: int, num_blocks: int,
                   block_size: int, enable_prefix_caching: bool = False, long_prefill_token_threshold: int = 0,
                   scheduling_policy: str = "fcfs", preemption_mode: str = "recompute",
                   num_swap_blocks: int = 0, sliding_windows: tuple = (None,), num_cpu_blocks: int = 0,
                   **kw) -> Scheduler:
    """A Scheduler from its config sections, built from the flat settings the tests vary;
    sliding_windows: a KV cache group per entry (None: full attention); num_cpu_blocks: the
    OffloadingConnector's host tier (0: no connector); `kw`: model_name,
    structured_output_manager, max_concurrent_batches."""
    if num_cpu_blocks:
        kw["engine_config"] = EngineConfig(kv_transfer=KVTransferConfig(
            "OffloadingConnector", "kv_both", {"num_cpu_blocks": num_cpu_blocks}))
    return Scheduler(
        SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                        max_model_len=max_model_len, long_prefill_token_threshold=long_prefill_token_threshold,
                        scheduling_policy=scheduling_policy, preemption_mode=preemption_mode),
        CacheConfig(block_size=block_size, enable_prefix_caching=enable_prefix_caching),
        KVCacheConfig(num_blocks, [KVCacheGroupSpec([f"layers.{g}.self_attn"], KVCacheSpec(block_size, 1, w))
                                   for g, w in enumerate(sliding_windows)], num_swap_blocks), **kw)


def held(block_ids: tuple[list[int], ...]) -> list[int]:
    """The blocks a request's tables hold over all groups (null entries left out)."""
    return [b for table in block_ids for b in table if b]


def window_start(window: int | None, num_computed: int) -> int:
    """The first position the query at num_computed attends to."""
    return 0 if window is None else max(num_computed - window + 1, 0)


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
    block_ids: list[list[int]]  # per KV cache group

    def key(self, pos: int) -> int:
        """What the KV slot at `pos` holds: a function of every token up to it."""
        return hash(tuple(self.token_ids[:pos + 1]))


class FakeWorker:
    """Holds what a model runner would hold, and checks every message it receives."""

    def __init__(self, block_size: int, token_fn, sliding_windows: tuple = (None,)):
        self.block_size = block_size
        self.windows = sliding_windows
        self.token_fn = token_fn
        self.reqs: dict[str, WorkerReq] = {}
        self.kv: dict[int, list] = defaultdict(lambda: [None] * block_size)
        self.host: dict[int, list] = {}
        self.host_tier: dict[int, list] = {}  # the offload connector's host slots

    def run_connector(self, meta) -> None:
        """The offload connector's copies, in the worker's order: saves (pages evicted this
        step, read before anything writes them), then loads."""
        for block_id, slot in meta.saves:
            assert block_id != 0
            self.host_tier[slot] = list(self.kv[block_id])
        for slot, block_id in meta.loads:
            assert block_id != 0
            self.kv[block_id] = list(self.host_tier[slot])

    def execute_model(self, so: SchedulerOutput) -> ModelRunnerOutput:
        # Drop state first: finished ids are each reported exactly once, for a request the
        # worker holds; preempted ones come back later as new requests.
        for req_id in so.finished_req_ids | so.preempted_req_ids:
            assert req_id in self.reqs, f"{req_id} dropped but the worker never held it"
            del self.reqs[req_id]
        assert not (so.finished_req_ids & so.preempted_req_ids)
        assert not (so.blocks_to_swap_out and so.blocks_to_swap_in)
        if so.kv_connector_metadata is not None:
            assert not (so.kv_connector_metadata.loads and so.blocks_to_swap_out)
            self.run_connector(so.kv_connector_metadata)
        for block_id, slot in so.blocks_to_swap_out:
            assert block_id != 0
            self.host[slot] = list(self.kv[block_id])
        for slot, block_id in so.blocks_to_swap_in:
            assert block_id != 0
            self.kv[block_id] = list(self.host.pop(slot))
        for new in so.scheduled_new_reqs:
            assert new.req_id not in self.reqs, f"{new.req_id} sent as new twice"
            assert len(new.block_ids) == len(self.windows)
            for window, table in zip(self.windows, new.block_ids):
                # Null entries: a sliding group's, before its window (a swapped request resumes).
                assert 0 not in table[window_start(window, new.num_computed_tokens) // self.block_size:]
            tokens = list(new.prompt_token_ids) + list(new.output_token_ids)
            assert 0 <= new.num_computed_tokens < len(tokens)
            self.reqs[new.req_id] = WorkerReq(tokens, new.num_computed_tokens, [list(t) for t in new.block_ids])
        cached = so.scheduled_cached_reqs
        assert len(cached.req_ids) == len(cached.new_block_ids) == len(cached.num_computed_tokens)
        for req_id, new_blocks, num_computed in zip(cached.req_ids, cached.new_block_ids,
                                                    cached.num_computed_tokens):
            assert req_id in self.reqs, f"{req_id} sent as cached but the worker does not hold it"
            state = self.reqs[req_id]
            assert num_computed == state.num_computed_tokens
            assert len(new_blocks) == len(self.windows)
            for table, added in zip(state.block_ids, new_blocks):
                assert 0 not in added
                table.extend(added)
        new_ids = [n.req_id for n in so.scheduled_new_reqs]
        assert len(set(new_ids) | set(cached.req_ids)) == len(new_ids) + len(cached.req_ids)
        assert set(so.num_scheduled_tokens) == set(new_ids) | set(cached.req_ids)

        # As in the model: every layer writes the step's K/V before any token attends.
        bs = self.block_size
        for req_id, n in so.num_scheduled_tokens.items():
            state = self.reqs[req_id]
            end = state.num_computed_tokens + n
            assert end <= len(state.token_ids), "scheduled tokens the worker does not have"
            for g, table in enumerate(state.block_ids):
                assert len(table) * bs >= end, "block table too short"
                for pos in range(state.num_computed_tokens, end):
                    assert table[pos // bs] != 0, "K/V written into the null block"
                    self.kv[table[pos // bs]][pos % bs] = (g, state.key(pos))
        req_ids, sampled = [], []
        for req_id, n in so.num_scheduled_tokens.items():
            state = self.reqs[req_id]
            end = state.num_computed_tokens + n
            for g, (window, table) in enumerate(zip(self.windows, state.block_ids)):
                for pos in range(window_start(window, state.num_computed_tokens), end):
                    assert self.kv[table[pos // bs]][pos % bs] == (g, state.key(pos)), \
                        f"{req_id} attends to a wrong KV entry at position {pos} (group {g})"
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
    priority: int = 0


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
    saw_swap: bool = False
    num_hit_tokens: int = 0
    sched_outputs: list[SchedulerOutput] = field(default_factory=list)
    stats: object = None


def run(specs: list[Spec], *, max_num_seqs: int, max_num_batched_tokens: int, max_model_len: int,
        num_blocks: int, block_size: int, token_fn, aborts=(),
        max_steps: int = 20_000, **sched_kw) -> RunResult:
    """Drive a Scheduler to completion, checking its invariants after every call.

    `aborts` is a list of (step, request index, mid_step): that request is aborted right
    before that step's schedule(), or between its schedule() and update_from_output() when
    mid_step (a no-op when it already finished or has not arrived). `sched_kw` go to the
    Scheduler (prefix caching, preemption mode, policy, ...).
    """
    sched = make_scheduler(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                           max_model_len=max_model_len, num_blocks=num_blocks, block_size=block_size,
                           **sched_kw)
    worker = FakeWorker(block_size, token_fn, sched_kw.get("sliding_windows", (None,)))
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
                assert held(sched.kv_cache_manager.get_block_ids(req_id)) == []
                assert sched.swap_space is None or req_id not in sched.swap_space.req_to_slots
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
                              sampling_params=spec.params, eos_token_id=spec.eos, sampling_seed=0,
                              priority=spec.priority, arrival_time=float(step))
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
            for mine, theirs in zip(worker.reqs[rid].block_ids, sched.kv_cache_manager.get_block_ids(rid)):
                # Where a window has passed, the worker keeps an old id the kernels never read.
                assert len(mine) == len(theirs) and all(b in (0, m) for m, b in zip(mine, theirs))
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
    assert all(m.req_to_blocks == {} for m in sched.kv_cache_manager.managers)
    assert sched.requests == {} and not sched.running and not sched.waiting
    assert all(b.ref_cnt == 0 for b in pool.blocks[1:])
    if sched.swap_space is not None:
        # (Slots of an aborted swapped request keep stale data, as real host memory does.)
        assert sched.swap_space.get_num_free_slots() == sched.swap_space.num_slots
    result.num_steps = step
    result.num_preemptions = sched.num_preemptions
    result.stats = sched.make_stats()
    return result


def check_state(sched: Scheduler, requests: dict[str, Request]) -> None:
    """Bookkeeping that must hold between any two calls."""
    mgr = sched.kv_cache_manager
    bs, pool = mgr.block_size, mgr.block_pool
    assert len(sched.running) <= sched.max_num_seqs
    running = {r.request_id for r in sched.running}
    waiting = {r.request_id for r in sched.waiting}
    assert len(running) == len(sched.running) and len(waiting) == len(sched.waiting)
    assert not running & waiting
    assert running | waiting == set(sched.requests)
    holders: dict[int, int] = defaultdict(int)
    swapped_slots: list[int] = []
    for rid, req in requests.items():
        if req.is_finished():
            assert rid not in sched.requests
            assert held(mgr.get_block_ids(rid)) == []
            continue
        assert sched.requests[rid] is req
        tables = mgr.get_block_ids(rid)
        blocks = held(tables)
        if rid in running:
            assert req.status == RequestStatus.RUNNING
            for table in tables:
                # The table covers the computed tokens, and holds nothing beyond them; null
                # entries only lead a sliding group's table.
                assert len(table) == cdiv(req.num_computed_tokens, bs)
                assert table == [0] * table.count(0) + table[table.count(0):]
            for manager, table in zip(mgr.managers, tables):
                if not hasattr(manager, "sliding_window"):
                    assert 0 not in table
        elif req.status == RequestStatus.SWAPPED:
            assert blocks == [] and req.num_computed_tokens > 0
            slots = [slot for _, _, slot in sched.swap_space.req_to_slots[rid]]
            assert 0 < len(slots) <= len(tables) * cdiv(req.num_computed_tokens, bs)
            swapped_slots.extend(slots)
        else:
            assert req.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED)
            assert req.num_computed_tokens == 0 and blocks == []
        assert req.num_tokens <= sched.max_model_len
        assert req.num_computed_tokens <= min(req.num_tokens, sched.max_model_len - 1)
        assert len(blocks) == len(set(blocks)), "a request holds one block twice"
        for b in blocks:
            holders[b] += 1
    assert 0 not in holders, "the null block was handed to a request"
    if not mgr.enable_caching:
        assert all(n == 1 for n in holders.values()), "a block is owned by two live requests"
    # Reference counts equal the number of holders; free + used = total.
    assert all(pool.blocks[b].ref_cnt == n for b, n in holders.items())
    assert all(blk.ref_cnt == 0 for blk in pool.blocks[1:] if blk.block_id not in holders)
    assert pool.null_block.ref_cnt == 1
    assert pool.get_num_free_blocks() == pool.num_blocks - 1 - len(holders)
    free = pool.free_block_queue.get_all_free_blocks()
    assert len(free) == pool.get_num_free_blocks()
    assert {blk.block_id for blk in free} == set(range(1, pool.num_blocks)) - set(holders)
    # The hash map and the blocks' own hashes agree.
    hashed = {blk.block_id for blk in pool.blocks if blk.block_hash is not None}
    mapped = [bid for same in pool.cached_block_hash_to_block.values() for bid in same]
    assert sorted(mapped) == sorted(hashed)
    for h, same in pool.cached_block_hash_to_block.items():
        assert same and all(blk.block_hash == h for blk in same.values())
    if not mgr.enable_caching:
        assert not hashed
    if sched.swap_space is not None:
        assert set(sched.swap_space.req_to_slots) <= waiting
        assert len(swapped_slots) == len(set(swapped_slots))
        assert sched.swap_space.get_num_free_slots() + len(swapped_slots) == sched.swap_space.num_slots


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
    bs = sched.kv_cache_manager.block_size
    start = dict(computed_before)
    for new in so.scheduled_new_reqs:
        assert new.req_id in waiting_before
        req = requests[new.req_id]
        assert list(new.prompt_token_ids) + list(new.output_token_ids) == req.all_token_ids
        assert new.block_ids == sched.kv_cache_manager.get_block_ids(new.req_id)
        if new.num_computed_tokens != computed_before[new.req_id]:  # a prefix-cache hit
            assert computed_before[new.req_id] == 0 and new.num_computed_tokens % bs == 0
            assert sched.kv_cache_manager.enable_caching
            result.num_hit_tokens += new.num_computed_tokens
        start[new.req_id] = new.num_computed_tokens
    swapped_in = {b for _, b in so.blocks_to_swap_in}
    assert len(swapped_in) == len(so.blocks_to_swap_in)
    assert swapped_in <= {b for new in so.scheduled_new_reqs for b in held(new.block_ids)}
    assert not (so.blocks_to_swap_in and so.preempted_req_ids)
    if so.blocks_to_swap_out:
        result.saw_swap = True
    # Waiting requests are admitted in queue order.
    admitted = [n.req_id for n in so.scheduled_new_reqs]
    assert admitted == waiting_before[:len(admitted)]
    # Preemption: newest running requests go, to the front of the queue (FCFS), recomputed or
    # swapped; a step that preempts admits nobody.
    if so.preempted_req_ids:
        assert not so.scheduled_new_reqs
        victims = [rid for rid in running_before if rid in so.preempted_req_ids]
        if sched.policy == "fcfs":
            assert victims == running_before[len(running_before) - len(victims):]
            assert [r.request_id for r in sched.waiting][:len(victims)] == victims  # order kept
        for rid in victims:
            assert requests[rid].status in (RequestStatus.PREEMPTED, RequestStatus.SWAPPED)
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
    threshold = sched.long_prefill_token_threshold
    for rid, n in n_sched.items():
        req = requests[rid]
        remaining = req.num_tokens - start[rid]
        assert n <= remaining and (threshold == 0 or n <= threshold)
        assert req.num_computed_tokens == start[rid] + n
        if n < remaining and n != threshold:
            assert so.total_num_scheduled_tokens == sched.max_num_batched_tokens
        if n < remaining:
            result.saw_chunked_prefill = True
        if start[rid] >= req.num_prompt_tokens:
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
def scheduler_options(draw, num_blocks: int):
    """Prefix caching (with an offload host tier of none to plenty of slots), swap (with host
    slots from none to plenty), priority, long-prefill cap."""
    swap, caching = draw(st.booleans()), draw(st.booleans())
    return dict(enable_prefix_caching=caching,
                num_cpu_blocks=draw(st.sampled_from([0, 1, 3, 64])) if caching else 0,
                preemption_mode="swap" if swap else "recompute",
                num_swap_blocks=draw(st.integers(0, 2 * num_blocks)) if swap else 0,
                scheduling_policy=draw(st.sampled_from(["fcfs", "priority"])),
                long_prefill_token_threshold=draw(st.sampled_from([0, 0, 1, 3, 8])))


@st.composite
def scenarios(draw, with_aborts=True, options=False):
    block_size = draw(st.sampled_from([1, 2, 3, 4, 8, 16]))
    max_model_len = draw(st.integers(2, 48))
    min_blocks = cdiv(max_model_len, block_size) + 1  # any single request fits
    num_blocks = draw(st.integers(min_blocks, min_blocks + 10))
    cfg = dict(max_num_seqs=draw(st.integers(1, 6)),
               max_num_batched_tokens=draw(st.integers(1, 40)),
               max_model_len=max_model_len, num_blocks=num_blocks, block_size=block_size)
    if options:
        cfg.update(draw(scheduler_options(num_blocks)))
    specs = []
    for _ in range(draw(st.integers(1, 8))):
        prompt_len = draw(st.integers(1, max_model_len - 1))
        max_tokens = draw(st.none() | st.integers(1, max_model_len))
        min_tokens = draw(st.integers(0, max_tokens if max_tokens is not None else 8))
        params = SamplingParams(
            max_tokens=max_tokens, min_tokens=min_tokens, ignore_eos=draw(st.booleans()),
            stop_token_ids=draw(st.lists(st.integers(0, VOCAB + 1), max_size=3)))
        # A shared run of 7s, then a tail from a tiny alphabet: prefixes overlap often.
        shared = draw(st.integers(0, prompt_len))
        tail = draw(st.lists(st.integers(5, 7), min_size=prompt_len - shared,
                             max_size=prompt_len - shared))
        specs.append(Spec(prompt=[7] * shared + tail, params=params,
                          eos=draw(st.sampled_from([None, 0, 1])),
                          arrival_step=draw(st.integers(0, 12)),
                          priority=draw(st.integers(0, 2)) if options else 0))
    aborts = []
    if with_aborts:
        aborts = draw(st.lists(st.tuples(st.integers(0, 40), st.integers(0, len(specs) - 1),
                                         st.booleans()),
                               max_size=4))
    return cfg, specs, aborts, draw(st.integers(0, 2**16))

