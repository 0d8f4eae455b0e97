"""The hybrid KV cache (vLLM's HybridKVCacheManager): a block table per KV cache group from
one pool, sliding-window groups holding only their window, prefix hits that every group
can serve. The property test drives the scheduler with the harness's fake worker, which
checks every K/V slot each token attends to in every group."""
from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sched_harness import check_final, hashed_tokens, make_scheduler, run, scenarios

from jaxvllm.core.kv_cache_interface import KVCacheSpec
from jaxvllm.core.kv_cache_manager import KVCacheManager, cdiv
from jaxvllm.core.request import Request
from jaxvllm.sampling_params import SamplingParams

WINDOWS = [(None, 4), (5,), (3, None, 3), (None, 9, 2)]


def manager(windows, num_blocks=40, block_size=4, caching=False) -> KVCacheManager:
    return KVCacheManager(num_blocks, block_size, 1024, caching, "m",
                          [KVCacheSpec(block_size, 1, w) for w in windows])


def request(req_id: str, tokens) -> Request:
    return Request(request_id=req_id, prompt_token_ids=list(tokens), sampling_params=SamplingParams(),
                   eos_token_id=None, sampling_seed=0)


def test_a_sliding_group_frees_blocks_that_fall_out_of_its_window():
    mgr = manager((None, 8))
    req = request("a", range(38))
    new = mgr.allocate_slots(req, 38)  # one chunk: every position is written this step
    assert [len(g) for g in new.blocks] == [10, 10]
    req.num_computed_tokens = 38
    req.output_token_ids.append(1)
    free = mgr.block_pool.get_num_free_blocks()
    assert mgr.allocate_slots(req, 1).blocks == ([], [])  # position 38: still in block 9
    # The query at 38 reads 31..38: blocks 7..9 stay, 0..6 go back.
    full, sliding = mgr.get_block_ids("a")
    assert len(full) == len(sliding) == 10 and 0 not in full
    assert sliding[:7] == [0] * 7 and 0 not in sliding[7:]
    assert mgr.block_pool.get_num_free_blocks() == free + 7
    assert mgr.num_blocks_held("a") == 13
    mgr.free(req)
    assert mgr.block_pool.get_num_free_blocks() == 39


def test_admission_counts_the_blocks_of_every_group():
    mgr = manager((None, 8, 8), num_blocks=10)  # 9 usable: 3 per group
    assert mgr.allocate_slots(request("a", range(16)), 16) is None  # 4 blocks x 3 groups
    assert mgr.block_pool.get_num_free_blocks() == 9
    assert mgr.allocate_slots(request("b", range(12)), 12) is not None
    assert mgr.block_pool.get_num_free_blocks() == 0


def test_a_prefix_hit_is_as_long_as_every_group_can_serve():
    mgr = manager((None, 6), caching=True)
    a = request("a", range(33))
    mgr.allocate_slots(a, 33)
    a.num_computed_tokens = 33
    mgr.free(a)  # every block stays cached
    b = request("b", list(range(32)) + [99])
    hit, length = mgr.get_computed_blocks(b)
    assert length == 32
    full, sliding = hit.get_block_ids()
    assert len(full) == len(sliding) == 8 and 0 not in full
    # The window before position 32 is 27..31: blocks 6 and 7 (cdiv(6 - 1, 4) = 2).
    assert sliding[:6] == [0] * 6 and 0 not in sliding[6:]
    # Evict the sliding group's block 7: its hit shrinks to a window ending earlier, and the
    # full group's with it.
    block7 = mgr.block_pool.blocks[sliding[7]]
    mgr.block_pool.touch([block7])
    mgr.block_pool._maybe_evict_cached_block(block7)
    hit, length = mgr.get_computed_blocks(b)
    assert length == 28 and [len(g) for g in hit.blocks] == [7, 7]
    assert hit.get_block_ids()[1][:5] == [0] * 5


def test_a_swapped_request_resumes_with_its_window_only():
    sched = make_scheduler(max_num_seqs=2, max_num_batched_tokens=64, max_model_len=64, num_blocks=40,
                           block_size=4, preemption_mode="swap", num_swap_blocks=40, sliding_windows=(None, 6))
    mgr, swap = sched.kv_cache_manager, sched.swap_space
    req = request("a", range(30))
    mgr.allocate_slots(req, 30)
    req.num_computed_tokens = 30
    req.output_token_ids.append(1)
    mgr.allocate_slots(req, 1)  # frees sliding blocks 0..5 (the query at 30 reads 25..30)
    pairs = swap.swap_out("a", mgr.get_block_ids("a"))
    assert len(pairs) == 8 + 2
    mgr.free(req)
    req.num_computed_tokens = 31
    new = mgr.allocate_slots(req, 1)  # resumes: the query at 31 reads 26..31
    full, sliding = mgr.get_block_ids("a")
    assert sliding[:6] == [0] * 6 and [len(g) for g in new.blocks] == [8, 2]
    back = swap.swap_in("a", (full, sliding))
    assert sorted(b for _, b in back) == sorted(full + sliding[6:])
    assert swap.get_num_free_slots() == 40


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(options=True), st.sampled_from(WINDOWS))
def test_random_schedules_keep_every_group_window_intact(scenario, windows):
    """Random arrivals, chunked prefill, preemption (recompute and swap), prefix hits and
    aborts with full and sliding groups: every token sees the right K/V in every group's
    window, outputs match the reference, and the pool is whole at the end."""
    cfg, specs, aborts, seed = scenario
    bs, max_len = cfg["block_size"], cfg["max_model_len"]
    cfg["num_blocks"] = len(windows) * cdiv(max_len, bs) + 1 + (cfg["num_blocks"] - cdiv(max_len, bs) - 1)
    token_fn = hashed_tokens(seed)
    res = run(specs, token_fn=token_fn, aborts=aborts, sliding_windows=windows, **cfg)
    check_final(specs, res, max_len, token_fn)
