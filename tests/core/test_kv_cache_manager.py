"""KVCacheManager: block tables grow by ceil division, all-or-nothing, freed whole."""
from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxvllm.core.kv_cache_manager import KVCacheManager, cdiv
from jaxvllm.core.request import Request
from jaxvllm.sampling_params import SamplingParams


def make_request(req_id: str, prompt_len: int = 4) -> Request:
    return Request(request_id=req_id, prompt_token_ids=list(range(prompt_len)),
                   sampling_params=SamplingParams(), eos_token_id=None, sampling_seed=0)


def test_cdiv():
    assert [cdiv(a, 4) for a in (0, 1, 3, 4, 5, 8, 9)] == [0, 1, 1, 1, 2, 2, 3]


def test_block_table_grows_by_ceil_division():
    mgr = KVCacheManager(num_blocks=20, block_size=4, max_model_len=64)
    req = make_request("a")
    # 5 tokens -> 2 blocks.
    new = mgr.allocate_slots(req, 5)
    assert len(new.blocks[0]) == 2
    assert mgr.get_block_ids("a")[0] == new.get_block_ids()[0]
    req.num_computed_tokens = 5
    # 3 more tokens fill the second block exactly: nothing new.
    new = mgr.allocate_slots(req, 3)
    assert new.blocks[0] == [] and new.get_block_ids()[0] == []
    req.num_computed_tokens = 8
    # One more token opens a third block.
    new = mgr.allocate_slots(req, 1)
    assert len(new.blocks[0]) == 1
    req.num_computed_tokens = 9
    # 12 more (21 total) -> 6 blocks, 3 new.
    new = mgr.allocate_slots(req, 12)
    assert len(new.blocks[0]) == 3
    ids = mgr.get_block_ids("a")[0]
    assert len(ids) == cdiv(21, 4) == 6
    assert len(set(ids)) == 6 and 0 not in ids
    assert mgr.block_pool.get_num_free_blocks() == 19 - 6
    assert mgr.usage == pytest.approx(6 / 19)


def test_new_blocks_are_appended_in_block_table_order():
    mgr = KVCacheManager(num_blocks=10, block_size=2, max_model_len=16)
    req = make_request("a")
    first = mgr.allocate_slots(req, 3).get_block_ids()[0]
    req.num_computed_tokens = 3
    second = mgr.allocate_slots(req, 4).get_block_ids()[0]
    assert mgr.get_block_ids("a")[0] == first + second


def test_requests_get_disjoint_blocks():
    mgr = KVCacheManager(num_blocks=9, block_size=4, max_model_len=32)
    a, b = make_request("a"), make_request("b")
    ia = mgr.allocate_slots(a, 13).get_block_ids()[0]
    ib = mgr.allocate_slots(b, 16).get_block_ids()[0]
    assert len(ia) == 4 and len(ib) == 4
    assert set(ia).isdisjoint(ib)
    assert 0 not in ia + ib


def test_short_pool_returns_none_and_allocates_nothing():
    mgr = KVCacheManager(num_blocks=5, block_size=4, max_model_len=64)  # 4 usable blocks
    a, b = make_request("a"), make_request("b")
    assert len(mgr.allocate_slots(a, 6).blocks[0]) == 2
    a.num_computed_tokens = 6
    before_a = mgr.get_block_ids("a")[0]
    # b needs 3 blocks, only 2 are free.
    assert mgr.allocate_slots(b, 9) is None
    assert mgr.get_block_ids("b")[0] == []
    assert mgr.block_pool.get_num_free_blocks() == 2
    # a growing past the pool fails without touching its table.
    assert mgr.allocate_slots(a, 11) is None  # 17 tokens -> 5 blocks > 4
    assert mgr.get_block_ids("a")[0] == before_a
    assert mgr.block_pool.get_num_free_blocks() == 2
    # Exactly what is left still fits.
    assert len(mgr.allocate_slots(b, 8).blocks[0]) == 2
    assert mgr.block_pool.get_num_free_blocks() == 0


def test_non_positive_token_count_raises():
    mgr = KVCacheManager(num_blocks=4, block_size=4, max_model_len=8)
    with pytest.raises(ValueError, match="positive"):
        mgr.allocate_slots(make_request("a"), 0)
    with pytest.raises(ValueError, match="positive"):
        mgr.allocate_slots(make_request("a"), -3)


def test_free_returns_every_block():
    mgr = KVCacheManager(num_blocks=12, block_size=3, max_model_len=30)
    a, b = make_request("a"), make_request("b")
    mgr.allocate_slots(a, 10)
    mgr.allocate_slots(b, 7)
    ids_a = mgr.get_block_ids("a")[0]
    assert mgr.block_pool.get_num_free_blocks() == 11 - 4 - 3
    mgr.free(a)
    assert mgr.get_block_ids("a")[0] == []
    assert "a" not in mgr.managers[0].req_to_blocks
    assert mgr.block_pool.get_num_free_blocks() == 11 - 3
    assert all(mgr.block_pool.blocks[i].ref_cnt == 0 for i in ids_a)
    mgr.free(b)
    assert mgr.block_pool.get_num_free_blocks() == 11
    assert mgr.usage == 0.0
    # Freeing a request that holds nothing (never allocated, or already freed) is a no-op.
    mgr.free(a)
    mgr.free(make_request("never"))
    assert mgr.block_pool.get_num_free_blocks() == 11


def test_free_after_failed_allocation():
    mgr = KVCacheManager(num_blocks=3, block_size=2, max_model_len=8)
    a = make_request("a")
    assert mgr.allocate_slots(a, 5) is None
    mgr.free(a)
    assert mgr.managers[0].req_to_blocks == {}
    assert mgr.block_pool.get_num_free_blocks() == 2


@settings(max_examples=100, deadline=None)
@given(num_blocks=st.integers(2, 30), block_size=st.integers(1, 8),
       seed=st.integers(0, 2**32 - 1), num_ops=st.integers(1, 60))
def test_random_allocations_match_a_model(num_blocks, block_size, seed, num_ops):
    rng = random.Random(seed)
    mgr = KVCacheManager(num_blocks=num_blocks, block_size=block_size, max_model_len=10**6)
    reqs = [make_request(f"r{i}") for i in range(4)]
    for _ in range(num_ops):
        req = rng.choice(reqs)
        if rng.random() < 0.2:
            mgr.free(req)
            req.num_computed_tokens = 0
        else:
            n = rng.randint(1, 3 * block_size + 1)
            have = len(mgr.get_block_ids(req.request_id)[0])
            need = cdiv(req.num_computed_tokens + n, block_size) - have
            free_before = mgr.block_pool.get_num_free_blocks()
            table_before = mgr.get_block_ids(req.request_id)[0]
            new = mgr.allocate_slots(req, n)
            if need > free_before:
                assert new is None
                assert mgr.block_pool.get_num_free_blocks() == free_before
                assert mgr.get_block_ids(req.request_id)[0] == table_before
            else:
                assert len(new.blocks[0]) == need
                assert mgr.get_block_ids(req.request_id)[0] == table_before + new.get_block_ids()[0]
                req.num_computed_tokens += n
        owned = [i for r in reqs for i in mgr.get_block_ids(r.request_id)[0]]
        assert 0 not in owned and len(owned) == len(set(owned))
        for r in reqs:
            assert len(mgr.get_block_ids(r.request_id)[0]) == cdiv(r.num_computed_tokens, block_size)
        assert mgr.block_pool.get_num_free_blocks() == num_blocks - 1 - len(owned)
    for r in reqs:
        mgr.free(r)
    assert mgr.block_pool.get_num_free_blocks() == num_blocks - 1


# ---- prefix caching ---------------------------------------------------------------------
def caching_mgr(num_blocks=20, block_size=4, model_name="m"):
    return KVCacheManager(num_blocks=num_blocks, block_size=block_size, max_model_len=64,
                          enable_caching=True, model_name=model_name)


def admit(mgr, req):
    """What the scheduler does at admission: look up the prefix, allocate the rest."""
    hit, num_hit = mgr.get_computed_blocks(req)
    blocks = mgr.allocate_slots(req, req.num_tokens - num_hit, hit, num_hit)
    if blocks is not None:
        req.num_computed_tokens = req.num_tokens
    return hit, num_hit


def prompt_request(req_id, tokens, salt=None):
    return Request(request_id=req_id, prompt_token_ids=list(tokens), sampling_params=SamplingParams(),
                   eos_token_id=None, sampling_seed=0, cache_salt=salt)


def test_computed_blocks_are_the_longest_cached_prefix_but_never_all():
    mgr = caching_mgr()
    a = prompt_request("a", range(12))
    assert admit(mgr, a)[1] == 0
    b = prompt_request("b", list(range(8)) + [99, 98, 97])
    hit, num_hit = admit(mgr, b)
    assert num_hit == 8 and hit.get_block_ids()[0] == mgr.get_block_ids("a")[0][:2]
    assert all(mgr.block_pool.blocks[i].ref_cnt == 2 for i in hit.get_block_ids()[0])
    # Identical prompt of exactly three blocks: the last token is recomputed, so two hit.
    assert admit(mgr, prompt_request("c", range(12)))[1] == 8
    s = mgr.prefix_cache_stats
    assert (s.requests, s.queries, s.hits) == (3, 12 + 11 + 12, 16)


def test_with_an_eagle3_head_the_last_block_of_a_hit_is_computed_again():
    """An EAGLE-3 head's KV at a block's last position holds the token after the block: a hit
    keeps every block but its last (vLLM's use_eagle)."""
    mgr = KVCacheManager(num_blocks=20, block_size=4, max_model_len=64, enable_caching=True, use_eagle=True)
    admit(mgr, prompt_request("a", range(13)))
    assert admit(mgr, prompt_request("b", list(range(12)) + [99]))[1] == 8
    assert admit(mgr, prompt_request("c", list(range(5)) + [99]))[1] == 0


def test_salt_and_model_name_are_part_of_the_hash():
    mgr = caching_mgr()
    admit(mgr, prompt_request("a", range(9), salt="x"))
    assert admit(mgr, prompt_request("b", range(9)))[1] == 0
    assert admit(mgr, prompt_request("c", range(9), salt="x"))[1] == 8
    # Another model never shares a block, and the difference chains into later blocks.
    other = caching_mgr(model_name="other")
    assert mgr._update_block_hashes(prompt_request("f", range(9)), 2) != \
        other._update_block_hashes(prompt_request("g", range(9)), 2)
    assert mgr._update_block_hashes(prompt_request("h", range(9)), 2)[1].hash_value != \
        other._update_block_hashes(prompt_request("i", range(9)), 2)[1].hash_value


def test_hit_on_free_cached_blocks_counts_against_the_pool():
    mgr = caching_mgr(num_blocks=5)  # 4 usable
    a = prompt_request("a", range(9))
    admit(mgr, a)  # 3 blocks, 2 cached
    mgr.free(a)
    assert mgr.block_pool.get_num_free_blocks() == 4
    # b hits a's 2 free blocks and needs 3 more: 2 + 3 > 4, so nothing is allocated.
    b = prompt_request("b", list(range(8)) + list(range(50, 60)))
    hit, num_hit = mgr.get_computed_blocks(b)
    assert num_hit == 8
    assert mgr.allocate_slots(b, b.num_tokens - 8, hit, 8) is None
    assert mgr.block_pool.get_num_free_blocks() == 4 and mgr.get_block_ids("b")[0] == []


@settings(max_examples=100, deadline=None)
@given(block_size=st.integers(1, 4), seed=st.integers(0, 2**32 - 1), num_ops=st.integers(1, 60))
def test_random_shared_prefixes_keep_refcounts_equal_to_holders(block_size, seed, num_ops):
    rng = random.Random(seed)
    mgr = caching_mgr(num_blocks=16, block_size=block_size)
    live: dict[str, Request] = {}
    for step in range(num_ops):
        if live and rng.random() < 0.4:
            mgr.free(live.pop(rng.choice(sorted(live))))
        else:
            req = prompt_request(f"r{step}", [rng.choice([1, 1, 2]) for _ in range(rng.randint(1, 12))])
            hit, num_hit = admit(mgr, req)
            assert num_hit < req.num_tokens and num_hit % block_size == 0
            if req.num_computed_tokens:
                live[req.request_id] = req
                # Hit blocks hold exactly the request's tokens.
                for i, blk in enumerate(hit.blocks[0]):
                    assert blk.block_hash.token_ids == tuple(req.all_token_ids[i * block_size:(i + 1) * block_size])
            else:
                mgr.free(req)
        holders = {}
        for rid in live:
            ids = mgr.get_block_ids(rid)[0]
            assert len(ids) == len(set(ids)) == cdiv(live[rid].num_tokens, block_size)
            for i in ids:
                holders[i] = holders.get(i, 0) + 1
        pool = mgr.block_pool
        assert all(pool.blocks[i].ref_cnt == n for i, n in holders.items())
        assert pool.get_num_free_blocks() + len(holders) == pool.num_blocks - 1
    for req in live.values():
        mgr.free(req)
    assert mgr.block_pool.get_num_free_blocks() == 15
    assert all(b.ref_cnt == 0 for b in mgr.block_pool.blocks[1:])
