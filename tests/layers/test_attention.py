"""write_kv (jaxvllm/layers/attention.py) against its contract: this step's K/V land in
exactly their slots of the layer, in the cache's dtype."""
from __future__ import annotations

import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from jaxvllm.layers.attention import write_kv


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_write_kv_writes_exactly_its_slots(dtype):
    rng = np.random.default_rng(1)
    layers, pages, ps, nkv, hd, n = 3, 6, 4, 2, 8, 7
    cache = jnp.asarray(rng.standard_normal((layers, 2, pages, ps, nkv, hd)), dtype)
    slots = rng.permutation(pages * ps)[:n].astype(np.int32)
    k = rng.standard_normal((n, nkv, hd)).astype(np.float32)
    v = rng.standard_normal((n, nkv, hd)).astype(np.float32)
    got = np.asarray(write_kv(cache, jnp.int32(1), jnp.asarray(k), jnp.asarray(v), slots), np.float32)
    want = np.asarray(cache, np.float32).copy()
    for t, slot in enumerate(slots):
        want[1, 0, slot // ps, slot % ps] = np.asarray(jnp.asarray(k[t], dtype), np.float32)
        want[1, 1, slot // ps, slot % ps] = np.asarray(jnp.asarray(v[t], dtype), np.float32)
    assert got.dtype == np.float32 and write_kv(cache, 1, k, v, slots).dtype == dtype
    np.testing.assert_array_equal(got, want)


def test_only_the_platform_that_runs_a_kernel_imports_it():
    # A TPU or GPU process never loads the C++ kernels; the xla backend loads no Pallas attention either.
    code = ("import sys; from jaxvllm.backends import get_backend; from jaxvllm.config import EngineConfig, "
            "ModelConfig; from jaxvllm.platforms import get_platform; "
            "config = EngineConfig(model=ModelConfig(dtype='float32', attention_backend='xla')); "
            "get_backend(config, get_platform('tpu')).attention(); "
            "print(sorted(m for m in sys.modules if m.startswith(('jaxvllm.kernels.', 'pallas_kernels.ragged'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["['jaxvllm.kernels.xla',", "'jaxvllm.kernels.xla.argmax',",
                           "'jaxvllm.kernels.xla.ragged_paged_attention']"]
