"""The CPU sampler's argmax of block maxima (jaxvllm/kernels/xla/argmax.py) against
`jnp.argmax`: the first index of each row's maximum, ties and rows of -inf included; a row
holding a NaN gets an index in range."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import backend_for

from jaxvllm.kernels.xla.argmax import blocked_argmax, first_argmax


@pytest.mark.parametrize("rows, width, block", [(5, 49152, 128), (3, 1000, 128), (4, 7, 128), (3, 300, 16)])
def test_blocked_argmax_matches_argmax(rows, width, block):
    rng = np.random.default_rng(width)
    x = rng.standard_normal((rows, width)).astype(np.float32)
    x[0, [width // 3, width - 1]] = 50.0                # a tie: the first index wins
    x[1] = -np.inf                                      # nothing left (argmax says 0)
    x[-1, [min(5, width - 1), width // 2]] = np.nan
    ours = jax.jit(blocked_argmax, static_argnames="block")(jnp.asarray(x), block=block)
    assert ours.dtype == jnp.int32
    np.testing.assert_array_equal(ours[:-1], jnp.argmax(jnp.asarray(x[:-1]), axis=-1))
    assert 0 <= int(ours[-1]) < width


def test_the_cpu_samples_with_it_and_accelerators_with_xla_argmax():
    assert backend_for("cpu").sampler_argmax is blocked_argmax
    assert backend_for("tpu").sampler_argmax is first_argmax is backend_for("cuda").sampler_argmax
