"""The native CPU kernel (jaxvllm/kernels/cpu) against the naive oracle (naive_attention.py),
on the same poisoned caches (any read outside a sequence's own
first kv_len rows would show), plus its build, its fallbacks and its errors."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from naive_attention import (  # noqa: E402
    DECODE,
    MIXED,
    PAST_WINDOW,
    PREFILL,
    assert_matches_naive,
    batches,
    build,
    naive,
    pages_before_window_dropped,
)

from jaxvllm.kernels.cpu import build as native_build  # noqa: E402
from jaxvllm.kernels.cpu.ragged_paged_attention import ragged_paged_attention  # noqa: E402

pytestmark = pytest.mark.skipif(not native_build.available(), reason="no C++ compiler: the kernel cannot build")

# Longer than the kernel's 32-token query blocks: blocks split a prompt, and later blocks
# start past the first pages.
LONG = [(70, 70), (1, 33), (40, 75), (33, 33)]


def check(args, tol=1e-5, **kw):
    kw.setdefault("sm_scale", args[0].shape[-1] ** -0.5)
    assert_matches_naive(ragged_paged_attention(*args, **kw), args, tol, **kw)


@pytest.mark.parametrize("seqs,nq,nkv,hd,ps", [
    (DECODE, 4, 4, 64, 4),
    (DECODE, 9, 3, 128, 4),
    (PREFILL, 6, 2, 128, 4),
    (PREFILL, 4, 1, 64, 4),
    (MIXED, 8, 2, 64, 4),
    (MIXED, 3, 1, 128, 4),
    (MIXED, 6, 2, 32, 4),
    (LONG, 9, 3, 64, 16),
    (LONG, 4, 1, 128, 8),
    (LONG, 8, 2, 128, 16),
    (DECODE, 9, 3, 64, 32),
], ids=["decode-r1-d64", "decode-r3-d128", "prefill-r3-d128", "prefill-r4-d64", "mixed-r4-d64",
        "mixed-r3-d128", "mixed-r3-d32", "long-r3-d64-ps16", "long-r4-d128-ps8", "long-r4-d128-ps16",
        "decode-r3-d64-ps32"])
def test_matches_naive(seqs, nq, nkv, hd, ps):
    check(build(np.random.default_rng(len(seqs) * nq + hd), seqs, nq=nq, nkv=nkv, hd=hd, ps=ps))


@pytest.mark.parametrize("window,cap", [(5, None), (None, 2.0), (3, 5.0), (40, None)])
@pytest.mark.parametrize("seqs", [MIXED, LONG], ids=["mixed", "long"])
@pytest.mark.parametrize("ps", [8, 16])  # 16: decode scores 16 keys at a time
def test_sliding_window_and_soft_cap(seqs, window, cap, ps):
    args = build(np.random.default_rng(7), seqs, nq=4, nkv=2, hd=64, ps=ps)
    args = (args[0] * 3,) + args[1:]  # larger scores so the cap bites
    check(args, sliding_window=window, soft_cap=cap)


def test_pages_before_the_window_are_not_read():
    """The pages wholly before a query's window (null in a sliding group's tables, NaN
    here) are never read."""
    args = pages_before_window_dropped(build(np.random.default_rng(5), PAST_WINDOW, nq=4, nkv=2, hd=64, ps=8),
                                    window=16, chunk_tokens=8)
    check(args, sliding_window=16)


@settings(max_examples=12, derandomize=True, deadline=None)
@given(seqs=batches(max_kv=80, num_tokens=96))
def test_random_batches(seqs):
    args = build(np.random.default_rng(len(seqs)), seqs, nq=6, nkv=2, hd=64, pad_seqs=4 - len(seqs),
                 num_tokens=96, pages_per_seq=21, num_pages=1 + 4 * 21 + 2)
    check(args)


def test_all_padding_step_gives_zeros():
    rng = np.random.default_rng(0)
    args = build(rng, [], nq=4, nkv=2, hd=64, pad_seqs=3, pad_tokens=5, pages_per_seq=3, num_pages=4)
    args = args[:3] + (np.zeros(3, np.int32), np.zeros((3, 3), np.int32), np.zeros(4, np.int32)) + args[6:]
    out = np.asarray(ragged_paged_attention(*args, sm_scale=0.125))
    assert out.shape == (5, 4, 64) and not out.any()


def test_inside_jit_loop_with_carried_cache():
    # As the model calls it: under jit, in a fori_loop over layers, the cache carried along.
    args = build(np.random.default_rng(5), MIXED, nq=8, nkv=2, hd=64)
    q, cache, _, *meta = args

    @jax.jit
    def run(q, cache):
        def body(layer, carry):
            acc, cache = carry
            return acc + ragged_paged_attention(q, cache, layer, *meta, sm_scale=0.125), cache
        return jax.lax.fori_loop(0, 2, body, (jnp.zeros_like(q), cache))[0]

    want = sum(naive(q, cache, layer, *meta, sm_scale=0.125) for layer in (0, 1))
    np.testing.assert_allclose(np.asarray(run(q, cache)), want, rtol=1e-5, atol=1e-5)


def native_target(args, **kw) -> str | None:
    """The FFI target a call lowers to (None: the XLA kernel)."""
    text = jax.jit(lambda *a: ragged_paged_attention(*a, sm_scale=0.125, **kw)).lower(*args).as_text()
    return next((t for t in ("jaxvllm_ragged_paged_attention_bf16_bits", "jaxvllm_ragged_paged_attention")
                 if t in text), None)


@pytest.mark.parametrize("seqs,nq,nkv,hd,ps", [(MIXED, 8, 2, 128, 4), (LONG, 9, 3, 64, 16), (DECODE, 6, 2, 32, 16)],
                         ids=["mixed-d128", "long-d64", "decode-d32"])
def test_bfloat16_pages_stored_as_bits_are_read_by_the_kernel(seqs, nq, nkv, hd, ps):
    """The CPU platform's bfloat16 cache (uint16 bits): read in place by the native kernel,
    widened to float32 exactly, so it matches the oracle on the same bfloat16 values."""
    q, cache, *rest = build(np.random.default_rng(3), seqs, nq=nq, nkv=nkv, hd=hd, ps=ps)
    pages = jnp.asarray(cache, jnp.bfloat16)
    args = (q, jax.lax.bitcast_convert_type(pages, jnp.uint16), *rest)
    assert native_target(args, kv_dtype=jnp.bfloat16) == "jaxvllm_ragged_paged_attention_bf16_bits"
    got = ragged_paged_attention(*args, sm_scale=hd ** -0.5, kv_dtype=jnp.bfloat16)
    assert_matches_naive(got, (q, pages.astype(jnp.float32), *rest), 1e-5, sm_scale=hd ** -0.5)
    window = ragged_paged_attention(*args, sm_scale=hd ** -0.5, kv_dtype=jnp.bfloat16, sliding_window=5, soft_cap=2.0)
    assert_matches_naive(window, (q, pages.astype(jnp.float32), *rest), 1e-5, sm_scale=hd ** -0.5,
                         sliding_window=5, soft_cap=2.0)


def test_other_sub_32_bit_caches_go_to_the_xla_kernel():
    args = build(np.random.default_rng(3), MIXED, nq=8, nkv=2, hd=128, dtype=jnp.bfloat16)
    assert native_target(args) is None  # a bfloat16 array (not its bits)
    assert ragged_paged_attention(*args, sm_scale=128 ** -0.5).dtype == jnp.bfloat16
    check(args, tol=2e-2)
    half = (args[0], jax.lax.bitcast_convert_type(args[1].astype(jnp.float16), jnp.uint16), *args[2:])
    assert native_target(half, kv_dtype=jnp.float16) is None


@pytest.mark.parametrize("field,value,match", [
    ("kv_lens", 1000, "cu_q_lens/kv_lens out of range"),
    ("page_indices", 10_000, "page index out of range"),
    ("num_seqs", 99, "num_seqs exceeds max_num_seqs"),
])
def test_bad_metadata_is_an_error_not_a_stray_read(field, value, match):
    args = list(build(np.random.default_rng(2), MIXED, nq=4, nkv=2, hd=64))
    i = {"kv_lens": 3, "page_indices": 4, "num_seqs": 6}[field]
    args[i] = np.array(args[i])
    args[i].flat[0] = value
    with pytest.raises(Exception, match=match):
        np.asarray(ragged_paged_attention(*args, sm_scale=0.125))


def test_build_without_a_compiler_says_why(monkeypatch, tmp_path):
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    with pytest.raises(native_build.NativeBuildError, match="no working C\\+\\+ compiler"):
        native_build.library_path()


def test_library_is_built_once_per_machine(monkeypatch, tmp_path):
    monkeypatch.setenv("JAXVLLM_NATIVE_CACHE", str(tmp_path))
    path = native_build.library_path()
    assert path.parent == tmp_path and path.stat().st_size > 0
    mtime = path.stat().st_mtime_ns
    assert native_build.library_path() == path and path.stat().st_mtime_ns == mtime
    assert list(tmp_path.iterdir()) == [path]  # no temporary files left behind


def test_unloadable_library_says_why(monkeypatch, tmp_path):
    broken = tmp_path / "broken.so"
    broken.write_bytes(b"not a shared library")
    monkeypatch.setattr(native_build, "library_path", lambda: broken)
    with pytest.raises(native_build.NativeBuildError, match="cannot load"):
        native_build.load.__wrapped__()  # the uncached body: nothing is registered
