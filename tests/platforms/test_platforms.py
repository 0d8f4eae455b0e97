"""One object per device kind decides what differs by device; the engine's defaults follow it."""
from __future__ import annotations

import types

import jax
import pytest

from jaxvllm import platforms
from jaxvllm.config import EngineArgs
from jaxvllm.models.layer_loops import switched_layers, unrolled_layers
from jaxvllm.platforms import get_platform


def test_current_platform_is_chosen_from_the_default_backend():
    assert platforms.current_platform is get_platform(jax.default_backend())
    assert get_platform("gpu") is get_platform("cuda")
    with pytest.raises(ValueError, match="No jaxvllm platform"):
        get_platform("metal")


@pytest.mark.parametrize("name,dtype,block_size,layer_loop,branches", [
    ("cpu", "float32", 16, switched_layers, True),
    ("cuda", "bfloat16", 16, unrolled_layers, False),
    ("tpu", "bfloat16", 32, unrolled_layers, False),
])
def test_engine_defaults_follow_the_platform(name, dtype, block_size, layer_loop, branches):
    platform = get_platform(name)
    config = EngineArgs().create_engine_config(types.SimpleNamespace(max_position_embeddings=8192), name)
    assert (config.dtype, config.cache.block_size) == (dtype, block_size)
    assert config.scheduler.max_model_len == (2048 if name == "cpu" else 8192)
    assert platform.layer_loop is layer_loop and platform.step_may_branch is branches
    assert platform.huge_pages is platform.serialize_executables is (name == "cpu")


@pytest.mark.parametrize("kind", ["linear", "experts"])
def test_packed_matmul_only_with_the_native_kernels_on_one_cpu_device(kind):
    from jaxvllm.kernels.cpu import build
    from jaxvllm.kernels.cpu.packed_matmul import PackedFusedMoEMethod, PackedLinearMethod
    cpu, tpu = get_platform("cpu"), get_platform("tpu")

    def packed(platform, backend, n, quantization=None):
        if kind == "linear":
            return isinstance(platform.linear_method(backend, n, quantization), PackedLinearMethod)
        return isinstance(platform.fused_moe_method(quantization, backend, n), PackedFusedMoEMethod)
    if build.available():
        assert packed(cpu, "native", 1)
        assert not packed(cpu, "native", 2)
        assert not packed(cpu, "native", 1, "int8")
    assert not packed(cpu, "xla", 1)
    assert not packed(tpu, "pallas", 1)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_cpu_half_precision_model_accumulates_its_dots_in_float32(dtype):
    """XLA:CPU's bfloat16 x bfloat16 -> bfloat16 dot ran at a quarter of -> float32's speed:
    the CPU's method accumulates in float32 and rounds once, as a TPU's or GPU's dot does. A
    bfloat16 model beside the native attention packs its weights for the native matmul
    (AVX-512's bfloat16 dot product, float32 sums: tests/kernels/test_packed_matmul.py)."""
    import jax.numpy as jnp
    import numpy as np

    from jaxvllm.kernels.cpu import build
    from jaxvllm.kernels.cpu.packed_matmul import PackedLinearMethod
    from jaxvllm.layers.linear import UnquantizedLinearMethod
    if build.available():
        native = get_platform("cpu").linear_method("native", 1, dtype=dtype)
        assert isinstance(native, PackedLinearMethod) == (dtype == "bfloat16")
    method = get_platform("cpu").linear_method("xla", 1, dtype=dtype)
    assert type(method) is UnquantizedLinearMethod and method.accumulate_dtype == jnp.float32
    assert get_platform("tpu").linear_method("pallas", 1, dtype=dtype).accumulate_dtype is None
    x = jax.random.normal(jax.random.key(0), (8, 256), dtype)
    w = jax.random.normal(jax.random.key(1), (256, 3, 32), dtype)
    y = method.apply(x, w)
    assert y.dtype == jnp.dtype(dtype) and y.shape == (8, 3, 32)
    want = np.einsum("ti,ijk->tjk", np.asarray(x, np.float32), np.asarray(w, np.float32))
    ulp = 2.0 ** -(jnp.finfo(dtype).nmant)  # one rounding of the float32 sum
    np.testing.assert_allclose(np.asarray(y, np.float32), want, rtol=ulp, atol=ulp)


def test_each_platform_picks_its_grouped_matmul_for_the_experts():
    from pallas_kernels import grouped_matmul_tpu
    from jaxvllm.kernels.xla import grouped_matmul
    grouped = {name: get_platform(name).fused_moe_method().grouped_matmul for name in ("cpu", "cuda", "tpu")}
    assert grouped == {"cpu": grouped_matmul.grouped_matmul, "cuda": jax.lax.ragged_dot,
                       "tpu": grouped_matmul_tpu.grouped_matmul}


def test_device_memory_from_the_backend_or_none():
    full = types.SimpleNamespace(memory_stats=lambda: {"bytes_limit": 100, "bytes_in_use": 7})
    silent = types.SimpleNamespace(memory_stats=lambda: None)
    assert get_platform("tpu").device_memory(full) == (100, 7)
    assert get_platform("cpu").device_memory(silent) is None
