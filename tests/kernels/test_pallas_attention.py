"""Both Pallas kernels (GPU/Triton and TPU/Mosaic) in interpret mode against the naive numpy
oracle of naive_attention.py, on its poisoned caches: every cache
element no real token owns holds +-1e30, page tables are shuffled and padded with arbitrary
page ids, so any read outside a sequence's own first kv_len rows would show.

Small blocks (`block_q`, `pages_per_block`) are used so that short cases still cross query
blocks, share blocks between sequences and take several double-buffered KV blocks."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from naive_attention import DECODE, MIXED, PREFILL, assert_matches_naive, batches, build, naive  # noqa: E402

from jaxvllm.layers.attention import write_kv  # noqa: E402
from pallas_kernels import ragged_paged_attention_gpu as gpu  # noqa: E402
from pallas_kernels import ragged_paged_attention_tpu as tpu  # noqa: E402

KERNELS = {
    "gpu": functools.partial(gpu.ragged_paged_attention, interpret=True, block_q=4, pages_per_block=2,
                             num_splits=1),
    # Split-KV: each item's KV blocks shared by 3 programs, merged by their softmax statistics.
    "gpu-split": functools.partial(gpu.ragged_paged_attention, interpret=True, block_q=4,
                                   pages_per_block=1, num_splits=3),
    "tpu": functools.partial(tpu.ragged_paged_attention, interpret=True, block_q=8, pages_per_block=2),
}
kernels = pytest.mark.parametrize("kernel", ["gpu", "tpu"])


def check(kernel, args, tol=1e-5, **kw):
    kw.setdefault("sm_scale", args[0].shape[-1] ** -0.5)
    assert_matches_naive(KERNELS[kernel](*args, **kw), args, tol, **kw)


# ps=4 and 2 pages per KV block: lengths 4/8/16 end on a page (and block) boundary, 5/9/17
# are one past, 17 spans three KV blocks.
@kernels
@pytest.mark.parametrize("seqs,nq,nkv,hd", [
    (DECODE, 4, 4, 64),
    (DECODE, 8, 2, 128),
    (PREFILL, 6, 2, 128),
    (PREFILL, 4, 1, 64),
    (MIXED, 8, 2, 64),
    (MIXED, 3, 1, 128),
], ids=["decode-r1-d64", "decode-r4-d128", "prefill-r3-d128", "prefill-r4-d64", "mixed-r4-d64",
        "mixed-r3-d128"])
def test_matches_naive(kernel, seqs, nq, nkv, hd):
    check(kernel, build(np.random.default_rng(len(seqs) * nq + hd), seqs, nq=nq, nkv=nkv, hd=hd))


@kernels
@pytest.mark.parametrize("window,cap", [(5, None), (None, 2.0), (3, 5.0)])
def test_sliding_window_and_soft_cap(kernel, window, cap):
    args = build(np.random.default_rng(7), MIXED, nq=4, nkv=2, hd=64)
    args = (args[0] * 3,) + args[1:]  # larger scores so the cap bites
    check(kernel, args, sliding_window=window, soft_cap=cap)


@kernels
def test_bfloat16_and_larger_pages(kernel):
    args = build(np.random.default_rng(3), MIXED, nq=8, nkv=2, hd=128, ps=8, dtype=jnp.bfloat16)
    out = KERNELS[kernel](*args, sm_scale=0.1)
    assert out.dtype == jnp.bfloat16
    check(kernel, args, tol=2e-2, sm_scale=0.1)


@pytest.mark.parametrize("window,cap", [(None, None), (6, 3.0)])
def test_gpu_split_kv(window, cap):
    args = build(np.random.default_rng(9), MIXED + [(2, 30)], nq=6, nkv=2, hd=64)
    check("gpu-split", args, sliding_window=window, soft_cap=cap)


@kernels
def test_default_block_sizes(kernel):
    # The defaults the model runs with (one KV block covers these short sequences).
    fn = {"gpu": gpu, "tpu": tpu}[kernel].ragged_paged_attention
    args = build(np.random.default_rng(5), MIXED, nq=6, nkv=2, hd=64, ps=16)
    got = np.asarray(fn(*args, sm_scale=0.125, interpret=True), np.float64)
    np.testing.assert_allclose(got, naive(*args, sm_scale=0.125), rtol=1e-5, atol=1e-5)


@kernels
def test_all_padding_step_gives_zeros(kernel):
    args = build(np.random.default_rng(0), [], nq=4, nkv=2, hd=64, pad_seqs=3, pad_tokens=5,
                 pages_per_seq=3, num_pages=4)
    args = args[:3] + (np.zeros(3, np.int32), np.zeros((3, 3), np.int32), np.zeros(4, np.int32)) + args[6:]
    out = np.asarray(KERNELS[kernel](*args, sm_scale=0.125))
    assert out.shape == (5, 4, 64) and not out.any()


@kernels
def test_write_then_attend_leaves_other_pages_untouched(kernel):
    # The step as the model runs it: write_kv puts the new tokens' K/V into their slots of a
    # poisoned cache, then the kernel attends; nothing else in the cache changes.
    rng = np.random.default_rng(11)
    seqs = [(1, 9), (5, 12), (4, 4)]
    q, cache, layer, kv_lens, page_indices, cu_q_lens, num_seqs = build(rng, seqs, nq=4, nkv=2, hd=64)
    ps, slots = cache.shape[3], []
    for s, (q_len, kv) in enumerate(seqs):
        pos = np.arange(kv - q_len, kv)
        slots += list(page_indices[s, pos // ps] * ps + pos % ps)
    slots += [0] * (q.shape[0] - len(slots))  # padding tokens write to the null page 0
    slots = np.asarray(slots, np.int32)
    k, v = rng.standard_normal((2, q.shape[0], 2, 64)).astype(np.float32)
    before = np.asarray(cache)
    cache = write_kv(cache, layer, jnp.asarray(k), jnp.asarray(v), slots)
    args = (q, cache, layer, kv_lens, page_indices, cu_q_lens, num_seqs)
    check(kernel, args)
    after = np.asarray(cache)
    touched = np.zeros(after.shape, bool)
    touched[int(layer), :, slots // ps, slots % ps] = True
    np.testing.assert_array_equal(after[~touched], before[~touched])


@settings(max_examples=5, derandomize=True, deadline=None)
@given(seqs=batches(), seed=st.integers(0, 2**16))
def test_random_batches(seqs, seed):
    # Fixed shapes (one compile per kernel): 4 seq slots, 6 pages/seq, 32 tokens.
    args = build(np.random.default_rng(seed), seqs, nq=6, nkv=2, hd=64, pad_seqs=4 - len(seqs),
                 num_tokens=32, pages_per_seq=6, num_pages=1 + 4 * 6 + 2)
    for kernel in ("gpu", "tpu"):
        check(kernel, args)


@pytest.mark.parametrize("dtype,nq,nkv,window,cap,tol", [
    (jnp.float32, 2, 1, None, None, 1e-5),
    (jnp.bfloat16, 4, 2, 4, 5.0, 2e-2),
], ids=["f32", "bf16-window-cap"])
def test_tpu_strict_interpreter(dtype, nq, nkv, window, cap, tol):
    # pltpu.InterpretParams emulates TPU semantics (DMA, semaphores, uninitialized VMEM) more
    # strictly than interpret=True; ~50x slower, so tiny cases only.
    from jax.experimental.pallas import tpu as pltpu
    args = build(np.random.default_rng(2), [(1, 9), (3, 5)], nq=nq, nkv=nkv, hd=64, pad_seqs=1,
                 pad_tokens=1, dtype=dtype)
    kw = dict(sm_scale=0.125, sliding_window=window, soft_cap=cap)
    got = tpu.ragged_paged_attention(*args, **kw, block_q=8, pages_per_block=2,
                                     interpret=pltpu.InterpretParams())
    np.testing.assert_allclose(np.asarray(got, np.float64), naive(*args, **kw), rtol=tol, atol=tol)


NATIVE = {"tpu": tpu, "gpu": gpu, "cuda": gpu, "rocm": gpu}.get(jax.devices()[0].platform)


# The cases compiled for a device, at the kernels' default block sizes (test_pallas_lowering.py
# lowers the same ones for TPU and CUDA on any machine).
native_dtypes = pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
native_cases = pytest.mark.parametrize("seqs,nq,nkv,hd,ps,window,cap", [
    (DECODE, 8, 8, 64, 16, None, None),
    (DECODE + [(1, 300)], 32, 8, 128, 16, None, None),
    (PREFILL + [(100, 100)], 12, 4, 128, 32, None, None),
    (MIXED + [(40, 200)], 24, 8, 128, 16, 50, None),
    (MIXED, 8, 2, 64, 64, None, 30.0),
], ids=["decode-r1-d64", "decode-r4-d128", "prefill-r3-d128-ps32", "mixed-r3-d128-window",
        "mixed-r4-d64-ps64-cap"])


@pytest.mark.skipif(NATIVE is None, reason="compiles the kernel for a TPU or GPU; none here")
@native_dtypes
@native_cases
def test_native_kernel(seqs, nq, nkv, hd, ps, window, cap, dtype):
    """The platform's kernel compiled for real (device_check.sh runs these on the device)."""
    args = build(np.random.default_rng(nq + hd + ps), seqs, nq=nq, nkv=nkv, hd=hd, ps=ps, dtype=dtype)
    kw = dict(sm_scale=hd ** -0.5, sliding_window=window, soft_cap=cap)
    got = np.asarray(NATIVE.ragged_paged_attention(*args, **kw), np.float64)
    tol = 1e-5 if dtype == jnp.float32 else 2e-2
    np.testing.assert_allclose(got, naive(*args, **kw), rtol=tol, atol=tol)
    assert not got[int(args[5][int(args[6][0])]):].any()


@pytest.mark.parametrize("pages_per_block", [2, 8])
def test_tpu_page_table_beyond_one_tile(pages_per_block):
    # The TPU kernel reads page indices from HBM a tile (128) at a time: sequences of 130 to
    # 350 pages, in rows padded to 384, take KV blocks on both sides of tile boundaries.
    args = build(np.random.default_rng(13), [(1, 700), (3, 530), (2, 260)], nq=4, nkv=2, hd=64, ps=2)
    assert args[4].shape[1] > 2 * 128
    got = tpu.ragged_paged_attention(*args, sm_scale=0.125, block_q=8, pages_per_block=pages_per_block,
                                     interpret=True)
    assert_matches_naive(got, args, 1e-5, sm_scale=0.125)


def test_tpu_strict_interpreter_beyond_one_tile():
    # Index DMAs and page DMAs in flight together, checked by the strict interpreter.
    from jax.experimental.pallas import tpu as pltpu
    args = build(np.random.default_rng(17), [(1, 140), (2, 133)], nq=2, nkv=1, hd=64, ps=1, pad_seqs=1)
    got = tpu.ragged_paged_attention(*args, sm_scale=0.125, block_q=8, pages_per_block=16,
                                     interpret=pltpu.InterpretParams())
    np.testing.assert_allclose(np.asarray(got, np.float64), naive(*args, sm_scale=0.125), rtol=1e-5, atol=1e-5)


def test_tpu_pages_per_block_power_of_two():
    args = build(np.random.default_rng(0), DECODE, nq=4, nkv=2, hd=64)
    with pytest.raises(ValueError, match="pages_per_block=3"):
        tpu.ragged_paged_attention(*args, sm_scale=0.125, pages_per_block=3, interpret=True)
