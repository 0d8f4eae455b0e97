"""The TPU's KV cache layout (backends/tpu.py: a page's tokens in rows of 8, heads
along lanes, each padded to 128 lanes) read by the kernels a TPU runs, the Mosaic kernel in interpret mode and the XLA
backend, against the naive oracle on the same poisoned batches as the portable layout; and
write_kv writing the same slots in both layouts. Padding lanes hold poison too, so a kernel
that read them would show."""
from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import backend_for
from naive_attention import MIXED, POISON, assert_matches_naive, build

from jaxvllm.kernels.xla import ragged_paged_attention as xla
from jaxvllm.layers.attention import write_kv
from pallas_kernels import ragged_paged_attention_tpu as tpu


def tpu_layout(cache):
    """[L, 2, P, ps, H, D] -> the TPU backend's shape, padding lanes poisoned."""
    L, _, P, ps, H, D = cache.shape
    shape = backend_for("tpu").kv_cache_shape(L, P, ps, H, D)
    lanes = shape[5] // H
    padded = jnp.pad(jnp.asarray(cache), ((0, 0),) * 5 + ((0, lanes - D),), constant_values=POISON)
    return padded.astype(cache.dtype).reshape(shape)


KERNELS = {"tpu": functools.partial(tpu.ragged_paged_attention, interpret=True, block_q=8, pages_per_block=2,
                                    kv_layout="tpu"),
           "xla": functools.partial(xla.ragged_paged_attention, pages_per_chunk=2, decode_pages_per_chunk=2,
                                    kv_layout="tpu")}


@pytest.mark.parametrize("kernel", sorted(KERNELS))
@pytest.mark.parametrize("nq,nkv,hd,window,cap", [(9, 3, 64, None, None), (4, 2, 128, 5, 2.0)],
                         ids=["smollm2-heads", "d128-window-cap"])
def test_kernels_read_the_tpu_layout(kernel, nq, nkv, hd, window, cap):
    args = build(np.random.default_rng(nq + hd), MIXED, nq=nq, nkv=nkv, hd=hd, ps=8)
    kw = dict(sm_scale=hd ** -0.5, sliding_window=window, soft_cap=cap)
    got = KERNELS[kernel](args[0], tpu_layout(args[1]), *args[2:], **kw)
    assert_matches_naive(got, args, 1e-5, **kw)


def test_write_kv_writes_the_same_slots_in_both_layouts():
    rng = np.random.default_rng(3)
    cache = build(rng, MIXED, nq=9, nkv=3, hd=64, ps=8)[1]
    k, v = rng.standard_normal((2, 6, 3, 64)).astype(np.float32)
    slots = np.array([0, 5, 17, 18, 40, 63], np.int32)
    portable = write_kv(cache, jnp.int32(1), jnp.asarray(k), jnp.asarray(v), slots)
    packed = write_kv(tpu_layout(cache), jnp.int32(1), jnp.asarray(k), jnp.asarray(v), slots, kv_layout="tpu")
    assert packed.shape == backend_for("tpu").kv_cache_shape(*cache.shape[:1], *cache.shape[2:])
    # The heads' own lanes match; the padding lanes are nobody's (write_kv zeroes a slot's).
    unpacked = np.asarray(packed).reshape(cache.shape[:4] + (3, -1))[..., :64]
    np.testing.assert_array_equal(unpacked, np.asarray(portable))
