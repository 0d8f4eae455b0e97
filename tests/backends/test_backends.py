"""One backend object per engine (jaxvllm/backends) decides the kernels from the config and the
platform: the layer loop, the linear and MoE methods, the grouped matmul, and each KV layout."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import backend_for

from jaxvllm.kernels.cpu import build
from jaxvllm.layers.linear import UnquantizedLinearMethod
from jaxvllm.layers.packed_linear import PackedFusedMoEMethod, PackedLinearMethod
from jaxvllm.models.layer_loops import switched_layers, unrolled_layers


@pytest.mark.parametrize("name,layer_loop", [("cpu", switched_layers), ("cuda", unrolled_layers),
                                             ("tpu", unrolled_layers)])
def test_the_layer_loop_follows_the_platform(name, layer_loop):
    backend = backend_for(name, "xla")
    assert backend.layer_loop is layer_loop and backend.platform.device_name == name


@pytest.mark.parametrize("kind", ["linear", "experts"])
def test_packed_matmul_only_with_the_native_kernels_on_one_cpu_device(kind):
    def packed(platform, attention_backend, n, quantization=None):
        backend = backend_for(platform, attention_backend, quantization=quantization, tensor_parallel_size=n)
        if kind == "linear":
            return isinstance(backend.linear_method, PackedLinearMethod)
        return isinstance(backend.moe_method, PackedFusedMoEMethod)
    if build.available():
        assert packed("cpu", "native", 1)
        assert not packed("cpu", "native", 2)
        assert not packed("cpu", "native", 1, "int8")
    assert not packed("cpu", "xla", 1)
    assert not packed("tpu", "pallas", 1)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_cpu_half_precision_model_accumulates_its_dots_in_float32(dtype):
    """XLA:CPU's bfloat16 x bfloat16 -> bfloat16 dot ran at a quarter of -> float32's speed:
    the CPU's method accumulates in float32 and rounds once, as a TPU's or GPU's dot does. A
    bfloat16 model beside the native attention packs its weights for the native matmul
    (AVX-512's bfloat16 dot product, float32 sums: tests/kernels/test_packed_matmul.py)."""
    if build.available():
        native = backend_for("cpu", "native", dtype=dtype).linear_method
        assert isinstance(native, PackedLinearMethod) == (dtype == "bfloat16")
    method = backend_for("cpu", "xla", dtype=dtype).linear_method
    assert type(method) is UnquantizedLinearMethod and method.accumulate_dtype == jnp.float32
    assert backend_for("tpu", "pallas", dtype=dtype).linear_method.accumulate_dtype is None
    x = jax.random.normal(jax.random.key(0), (8, 256), dtype)
    w = jax.random.normal(jax.random.key(1), (256, 3, 32), dtype)
    y = method.apply(x, w)
    assert y.dtype == jnp.dtype(dtype) and y.shape == (8, 3, 32)
    want = np.einsum("ti,ijk->tjk", np.asarray(x, np.float32), np.asarray(w, np.float32))
    ulp = 2.0 ** -(jnp.finfo(dtype).nmant)  # one rounding of the float32 sum
    np.testing.assert_allclose(np.asarray(y, np.float32), want, rtol=ulp, atol=ulp)


def test_each_platform_picks_its_grouped_matmul_for_the_experts():
    from jaxvllm.kernels.xla import grouped_matmul
    from pallas_kernels import grouped_matmul_tpu
    grouped = {name: backend_for(name, "xla").moe_method.grouped_matmul for name in ("cpu", "cuda", "tpu")}
    assert grouped == {"cpu": grouped_matmul.grouped_matmul, "cuda": jax.lax.ragged_dot,
                       "tpu": grouped_matmul_tpu.grouped_matmul}


def test_a_draft_model_and_lora_run_the_float_methods_beside_quantized_weights():
    backend = backend_for("tpu", quantization="int8")
    assert backend.linear_method.quantization == "int8"
    assert type(backend.float_linear_method) is UnquantizedLinearMethod
    assert type(backend.float_moe_method).__name__ == "UnquantizedFusedMoEMethod"


def test_kv_cache_shape_in_each_layout():
    assert backend_for("cuda").kv_cache_shape(30, 7, 16, 3, 64) == (30, 2, 7, 16, 3, 64)
    # The TPU's: a page's tokens in rows of 8, each head's lanes padded to 128.
    assert backend_for("tpu").kv_cache_shape(30, 7, 32, 3, 64) == (30, 2, 7, 4, 8, 3 * 128)
