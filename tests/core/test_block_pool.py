"""BlockPool: the null block, reference counting and the free list."""
from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxvllm.core.block_pool import BlockHash, BlockPool, KVCacheBlock
from jaxvllm.core.free_queue import FreeKVCacheBlockQueue


def test_needs_room_for_the_null_block():
    with pytest.raises(ValueError, match="num_blocks"):
        BlockPool(1)
    BlockPool(2)


def test_null_block_is_never_handed_out():
    pool = BlockPool(5)
    assert pool.null_block.block_id == 0
    assert pool.get_num_free_blocks() == 4
    blocks = pool.get_new_blocks(4)
    assert sorted(b.block_id for b in blocks) == [1, 2, 3, 4]
    assert pool.get_num_free_blocks() == 0
    with pytest.raises(ValueError, match="only 0 are free"):
        pool.get_new_blocks(1)


def test_freeing_the_null_block_is_a_no_op():
    """A sliding-window group's table holds it where its window has passed."""
    pool = BlockPool(3)
    pool.free_blocks([pool.null_block])
    pool.touch([pool.null_block])
    assert pool.null_block.ref_cnt == 1
    assert pool.get_num_free_blocks() == 2


def test_allocation_sets_ref_count_and_free_returns_blocks():
    pool = BlockPool(6)
    a = pool.get_new_blocks(2)
    b = pool.get_new_blocks(3)
    assert all(blk.ref_cnt == 1 for blk in a + b)
    assert {blk.block_id for blk in a}.isdisjoint({blk.block_id for blk in b})
    assert pool.get_num_free_blocks() == 0
    pool.free_blocks(a)
    assert all(blk.ref_cnt == 0 for blk in a)
    assert pool.get_num_free_blocks() == 2
    # Freed blocks are handed out again.
    again = pool.get_new_blocks(2)
    assert {blk.block_id for blk in again} == {blk.block_id for blk in a}


def test_shared_block_returns_only_when_last_reference_drops():
    pool = BlockPool(3)
    (blk,) = pool.get_new_blocks(1)
    blk.ref_cnt += 1  # a second holder, as prefix sharing would add
    pool.free_blocks([blk])
    assert blk.ref_cnt == 1
    assert pool.get_num_free_blocks() == 1
    pool.free_blocks([blk])
    assert blk.ref_cnt == 0
    assert pool.get_num_free_blocks() == 2


def test_double_free_raises():
    pool = BlockPool(4)
    blocks = pool.get_new_blocks(2)
    pool.free_blocks(blocks)
    with pytest.raises(RuntimeError, match="freed more often than allocated"):
        pool.free_blocks(blocks[:1])
    assert pool.get_num_free_blocks() == 3
    # A block that was never allocated cannot be freed either.
    fresh = BlockPool(4)
    with pytest.raises(RuntimeError):
        fresh.free_blocks([fresh.blocks[2]])


def test_over_allocation_raises_and_allocates_nothing():
    pool = BlockPool(4)
    pool.get_new_blocks(1)
    with pytest.raises(ValueError, match="Cannot get 3 blocks: only 2 are free"):
        pool.get_new_blocks(3)
    assert pool.get_num_free_blocks() == 2
    assert sum(b.ref_cnt for b in pool.blocks[1:]) == 1


def test_zero_blocks_is_a_no_op():
    pool = BlockPool(3)
    assert pool.get_new_blocks(0) == []
    pool.free_blocks([])
    assert pool.get_num_free_blocks() == 2


def test_usage_fraction_excludes_null_block():
    pool = BlockPool(5)
    assert pool.get_usage() == 0.0
    a = pool.get_new_blocks(1)
    assert pool.get_usage() == pytest.approx(0.25)
    b = pool.get_new_blocks(3)
    assert pool.get_usage() == pytest.approx(1.0)
    pool.free_blocks(b)
    assert pool.get_usage() == pytest.approx(0.25)
    pool.free_blocks(a)
    assert pool.get_usage() == 0.0


@settings(max_examples=100, deadline=None)
@given(num_blocks=st.integers(2, 40), seed=st.integers(0, 2**32 - 1), num_ops=st.integers(1, 80))
def test_random_alloc_free_keeps_pool_consistent(num_blocks, seed, num_ops):
    """Random allocations and frees against a model of who holds what."""
    rng = random.Random(seed)
    pool = BlockPool(num_blocks)
    held: list[list] = []
    for _ in range(num_ops):
        free = pool.get_num_free_blocks()
        if held and rng.random() < 0.4:
            pool.free_blocks(held.pop(rng.randrange(len(held))))
        else:
            n = rng.randint(0, num_blocks)
            if n > free:
                with pytest.raises(ValueError):
                    pool.get_new_blocks(n)
            else:
                held.append(pool.get_new_blocks(n))
        owned = [b.block_id for group in held for b in group]
        assert 0 not in owned
        assert len(owned) == len(set(owned))
        assert pool.get_num_free_blocks() == num_blocks - 1 - len(owned)
        assert pool.get_usage() == pytest.approx(len(owned) / (num_blocks - 1))
        for b in pool.blocks[1:]:
            assert b.ref_cnt == (1 if b.block_id in owned else 0)
        assert pool.null_block.ref_cnt == 1
    for group in held:
        pool.free_blocks(group)
    assert pool.get_num_free_blocks() == num_blocks - 1


# ---- the free queue and prefix caching -------------------------------------------------
def test_free_queue_pops_head_removes_middle_appends_tail():
    blocks = [KVCacheBlock(i) for i in range(5)]
    q = FreeKVCacheBlockQueue(blocks)
    assert q.popleft() is blocks[0]
    q.remove(blocks[2])
    q.append(blocks[0])
    assert [b.block_id for b in q.get_all_free_blocks()] == [1, 3, 4, 0]
    assert q.num_free_blocks == 4
    with pytest.raises(RuntimeError, match="not in the free queue"):
        q.remove(blocks[2])


@settings(max_examples=100, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["pop", "remove", "append"]), st.integers(0, 9)),
                    max_size=60))
def test_free_queue_matches_a_list(ops):
    blocks = [KVCacheBlock(i) for i in range(10)]
    q, model = FreeKVCacheBlockQueue(blocks[:6]), blocks[:6]
    model = list(model)
    for op, i in ops:
        if op == "pop" and model:
            assert q.popleft() is model.pop(0)
        elif op == "remove" and blocks[i] in model:
            q.remove(blocks[i])
            model.remove(blocks[i])
        elif op == "append" and blocks[i] not in model:
            q.append(blocks[i])
            model.append(blocks[i])
        assert q.get_all_free_blocks() == model and q.num_free_blocks == len(model)


def _hash(i):
    return BlockHash(i, (i,))


def test_cached_blocks_survive_free_until_reused_lru():
    pool = BlockPool(5, enable_caching=True)
    a = pool.get_new_blocks(2)
    pool.cache_full_blocks(a, [_hash(1), _hash(2)], 0, 2)
    assert pool.get_cached_block(_hash(1)) is a[0]
    pool.free_blocks(reversed(a))  # tail first: a[1] is evicted before a[0]
    assert pool.get_num_free_blocks() == 4 and pool.get_cached_block(_hash(2)) is a[1]
    # A hit takes the free block back out of the queue.
    pool.touch([a[0]])
    assert a[0].ref_cnt == 1 and pool.get_num_free_blocks() == 3
    # New blocks come from the head: the two never-used ones, then the LRU cached a[1].
    fresh = pool.get_new_blocks(2)
    assert a[1] not in fresh and a[1].block_hash is not None
    assert pool.get_new_blocks(1) == [a[1]]
    assert a[1].block_hash is None and pool.get_cached_block(_hash(2)) is None
    assert pool.get_cached_block(_hash(1)) is a[0]


def test_reset_prefix_cache_only_when_nothing_is_held():
    pool = BlockPool(4, enable_caching=True)
    a = pool.get_new_blocks(1)
    pool.cache_full_blocks(a, [_hash(7)], 0, 1)
    assert not pool.reset_prefix_cache()
    pool.free_blocks(a)
    assert pool.get_cached_block(_hash(7)) is a[0]
    assert pool.reset_prefix_cache()
    assert pool.get_cached_block(_hash(7)) is None and a[0].block_hash is None
