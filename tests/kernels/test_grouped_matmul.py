"""The grouped matmuls of the mixture-of-experts layer against `jax.lax.ragged_dot`: the CPU's
(jaxvllm/kernels/xla/grouped_matmul.py) and the TPU's (Pallas megablox, in interpret mode, and
lowered for a TPU on this CPU)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import pytest

from test_pallas_lowering import lower
from pallas_kernels.grouped_matmul_tpu import grouped_matmul
from jaxvllm.kernels.xla import grouped_matmul as xla


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
