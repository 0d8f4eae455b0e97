"""The grouped matmuls of the mixture-of-experts layer against `jax.lax.ragged_dot`: the CPU's
(the native kernel over packed experts, jaxvllm/kernels/cpu/packed_matmul.cc, and the XLA loop,
jaxvllm/kernels/xla/grouped_matmul.py) and the TPU's (Pallas megablox, in interpret mode, and
lowered for a TPU on this CPU)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_pallas_lowering import lower

from jaxvllm.kernels.cpu import build as native_build
from jaxvllm.kernels.cpu.packed_matmul import grouped_packed_matmul, pack_experts
from jaxvllm.kernels.xla import grouped_matmul as xla
from jaxvllm.layers.fused_moe import UnquantizedFusedMoEMethod, select_experts
from jaxvllm.layers.packed_linear import PackedFusedMoEMethod
from pallas_kernels.grouped_matmul_tpu import grouped_matmul


def operands(m=64, k=64, n=96, group_sizes=(10, 0, 30, 12)):
    rng = np.random.default_rng(0)
    return (jnp.asarray(rng.standard_normal((m, k)), jnp.float32),
            jnp.asarray(rng.standard_normal((len(group_sizes), k, n)), jnp.float32),
            jnp.asarray(group_sizes, jnp.int32))


def test_interpret_matches_ragged_dot():
    """An empty group, and rows past the last group (which megablox leaves unwritten)."""
    x, w, sizes = operands()
    rows = int(sizes.sum())
    ours = grouped_matmul(x, w, sizes, interpret=True)[:rows]
    np.testing.assert_allclose(ours, jax.lax.ragged_dot(x, w, sizes)[:rows], rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("m, group_sizes, tile", [
    (64, (10, 0, 30, 12), 16),   # an empty group, groups sharing tiles, rows past the last group
    (7, (3, 0, 0, 4), 64),       # fewer rows than a tile
    (130, (1, 100, 0, 29), 16),  # rows padded to whole tiles; a group across many tiles
    (32, (0, 0, 0, 0), 16),      # no rows routed here (an expert-parallel device's share)
])
def test_xla_grouped_matmul_matches_ragged_dot(m, group_sizes, tile):
    x, w, sizes = operands(m=m, k=32, n=48, group_sizes=group_sizes)
    ours = jax.jit(xla.grouped_matmul, static_argnames="tile")(x, w, sizes, tile=tile)
    np.testing.assert_allclose(ours, jax.lax.ragged_dot(x, w, sizes), rtol=1e-5, atol=1e-4)


def test_lowers_for_tpu():
    text = lower(grouped_matmul, "tpu", *operands(m=256, k=256, n=384))
    assert text.count("tpu_custom_call") == 1


native = pytest.mark.skipif(not native_build.available(), reason="no C++ compiler: the kernel cannot build")


@native
@pytest.mark.parametrize("m, group_sizes", [
    (64, (10, 0, 30, 12)),     # an empty group, rows past the last group (zeros)
    (2, (0, 1, 0, 1)),         # a decode token's two experts
    (420, (1, 200, 0, 219)),   # groups over several 192-row chunks and 12-row tiles
    (16, (0, 0, 0, 0)),        # no rows routed here
    (8, (5, 9, 0, 0)),         # sizes past the rows are clamped
])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_native_grouped_packed_matmul_matches_ragged_dot(m, group_sizes, dtype):
    x, w, sizes = operands(m=m, k=40, n=96, group_sizes=group_sizes)
    x, w = x.astype(dtype), w.astype(dtype)  # bfloat16: the same values, float32 sums
    ours = jax.jit(grouped_packed_matmul)(x, pack_experts(w), sizes)
    rows = min(m, int(sizes.sum()))
    want = np.asarray(jax.lax.ragged_dot(x, w, jnp.asarray(np.diff(np.minimum(np.cumsum([0, *group_sizes]), m)),
                                                             jnp.int32), preferred_element_type=jnp.float32))
    np.testing.assert_allclose(ours[:rows], want[:rows], rtol=1e-5, atol=1e-4)
    assert not np.asarray(ours[rows:]).any()


@native
def test_packed_experts_layer_matches_the_unpacked_one():
    """The layer as a model runs it: gate_up [experts, hidden, 2, inter] and down [experts,
    inter, hidden] stored packed, against the same weights through ragged_dot."""
    rng = np.random.default_rng(1)
    E, hidden, inter, T = 8, 64, 48, 5
    gate_up = jnp.asarray(rng.standard_normal((E, hidden, 2, inter)) * 0.1, jnp.float32)
    down = jnp.asarray(rng.standard_normal((E, inter, hidden)) * 0.1, jnp.float32)
    x = jnp.asarray(rng.standard_normal((T, hidden)), jnp.float32)
    weights, ids = select_experts(jnp.asarray(rng.standard_normal((T, E)), jnp.float32), 2, True)
    packed = PackedFusedMoEMethod()
    stored = [packed.process_weights_after_loading(w) for w in (gate_up, down)]
    assert [s.shape for s in stored] == [packed.weight_shape(w.shape, w.dtype) for w in (gate_up, down)]
    assert stored[0].shape == (E, 2 * inter // 32, hidden, 32) and stored[1].shape == (E, hidden // 32, inter, 32)
    ours = jax.jit(packed.apply)(x, *stored, weights, ids)
    want = UnquantizedFusedMoEMethod().apply(x, gate_up, down, weights, ids)
    np.testing.assert_allclose(ours, want, rtol=1e-5, atol=1e-5)
    # A width the panels do not divide stays as declared and runs the fallback.
    assert packed.weight_shape((E, hidden, 2, 20), jnp.float32) == (E, hidden, 2, 20)
