"""The TPU's grouped matmul (Pallas megablox, jaxvllm/kernels/pallas/grouped_matmul_tpu.py) in
interpret mode against `jax.lax.ragged_dot`, and lowered for a TPU on this CPU."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from test_pallas_lowering import lower
from jaxvllm.kernels.pallas.grouped_matmul_tpu import grouped_matmul


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


def test_lowers_for_tpu():
    text = lower(grouped_matmul, "tpu", *operands(m=256, k=256, n=384))
    assert text.count("tpu_custom_call") == 1
