"""The native packed matmul (jaxvllm/kernels/cpu/packed_matmul.cc) against float64 numpy: shapes
around its 12-row tiles, 192-row chunks and 32-column panels, in float32
and bfloat16 (pairs of rows packed together), the packing round trip, its use
as the model calls it (jit, fori_loop, lax.switch over per-layer weights), its errors, and the
worker storing weights packed, from construction on, only where the native kernels run on one
device."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxvllm import LLM
from jaxvllm.kernels.cpu import build as native_build
from jaxvllm.kernels.cpu.packed_matmul import PANEL, pack_weight, packed_matmul
from jaxvllm.layers.linear import UnquantizedLinearMethod
from jaxvllm.layers.packed_linear import PackedLinearMethod
from jaxvllm.models.llama import LlamaForCausalLM

pytestmark = pytest.mark.skipif(not native_build.available(), reason="no C++ compiler: the kernel cannot build")


def operands(m, k, n, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((m, k), np.float32), rng.standard_normal((k, n), np.float32)


def assert_close(y, x, w):
    want = x.astype(np.float64) @ w.astype(np.float64)
    assert y.shape == want.shape and y.dtype == np.float32
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5 * np.sqrt(x.shape[1]))


@pytest.mark.parametrize("m,k,n", [(1, 64, 32), (12, 7, 64), (13, 576, 192), (192, 96, 96), (193, 33, 1536),
                                   (400, 128, 320)])
def test_matches_float64(m, k, n):
    x, w = operands(m, k, n)
    assert_close(np.asarray(packed_matmul(jnp.asarray(x), pack_weight(w))), x, w)


def assert_close_bf16(y, x, w):
    """bfloat16 operands, float32 sums, the result rounded once to bfloat16."""
    want = np.asarray(x, np.float64) @ np.asarray(w, np.float64)
    assert y.shape == want.shape and y.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(y, np.float64), want, rtol=2.0 ** -8, atol=1e-5 * np.sqrt(x.shape[1]))


@pytest.mark.parametrize("m,k,n", [(1, 64, 32), (12, 8, 64), (13, 576, 192), (193, 34, 1536), (40, 1536, 64),
                                   (400, 640, 320)])
def test_bfloat16_matches_float64(m, k, n):
    x, w = (jnp.asarray(a, jnp.bfloat16) for a in operands(m, k, n))
    assert_close_bf16(packed_matmul(x, pack_weight(w)), x, w)


@settings(max_examples=15, derandomize=True, deadline=None)
@given(m=st.integers(1, 260), k=st.integers(1, 160), panels=st.integers(1, 9))
def test_random_shapes(m, k, panels):
    x, w = operands(m, k, panels * PANEL, seed=m * k)
    assert_close(np.asarray(packed_matmul(jnp.asarray(x), pack_weight(w))), x, w)


@settings(max_examples=10, derandomize=True, deadline=None)
@given(m=st.integers(1, 260), pairs=st.integers(1, 300), panels=st.integers(1, 5), num_rows=st.integers(0, 300))
def test_bfloat16_random_shapes_and_real_rows(m, pairs, panels, num_rows):
    x, w = (jnp.asarray(a, jnp.bfloat16) for a in operands(m, 2 * pairs, panels * PANEL, seed=m * pairs))
    y = jax.jit(packed_matmul)(x, pack_weight(w), jnp.int32(num_rows))
    real = min(num_rows, m)
    assert_close_bf16(y[:real], x[:real], w)
    assert not np.asarray(y[real:], np.float32).any()


def test_bfloat16_rows_are_packed_in_pairs():
    w = jnp.arange(4 * 64, dtype=jnp.float32).reshape(4, 64).astype(jnp.bfloat16)
    packed = np.asarray(pack_weight(w), np.float32)
    assert packed.shape == (2, 4, PANEL)
    # panel s, pair p: column j of rows 2p and 2p + 1 side by side
    np.testing.assert_array_equal(packed.reshape(2, 2, PANEL, 2).transpose(1, 3, 0, 2).reshape(4, 64),
                                  np.asarray(w, np.float32))


def test_pack_round_trip_is_exact_and_leading_dims_are_kept():
    x, w = operands(6, 40, 96)
    packed = pack_weight(w)
    assert packed.shape == (3, 40, PANEL)
    np.testing.assert_array_equal(np.asarray(packed).transpose(1, 0, 2).reshape(40, 96), w)  # unpacked
    y = packed_matmul(jnp.asarray(x).reshape(2, 3, 40), packed)
    assert y.shape == (2, 3, 96)
    assert_close(np.asarray(y).reshape(6, 96), x, w)


def test_zero_rows():
    _, w = operands(1, 16, 32)
    assert packed_matmul(jnp.zeros((0, 16)), pack_weight(w)).shape == (0, 32)


@pytest.mark.parametrize("m,num_rows", [(64, 33), (2048, 377), (16, 0), (8, 8), (8, 100)])
def test_num_rows_multiplies_only_the_real_rows_and_zeroes_the_padding(m, num_rows):
    # As a step calls it: x padded to its token bucket, num_rows real tokens (traced, under jit).
    x, w = operands(m, 96, 64, seed=m)
    y = np.asarray(jax.jit(packed_matmul)(jnp.asarray(x), pack_weight(w), jnp.int32(num_rows)))
    real = min(num_rows, m)
    assert_close(y[:real], x[:real], w)
    assert not y[real:].any()


def test_per_layer_weights_under_jit_fori_loop_and_switch():
    # As the model calls it: each layer's packed weight picked by lax.switch inside fori_loop.
    x, w0 = operands(9, 64, 64, seed=1)
    _, w1 = operands(9, 64, 64, seed=2)
    branches = [lambda h, p=pack_weight(w): jnp.tanh(PackedLinearMethod().apply(h, p))  # noqa: B008
                for w in (w0, w1)]

    @jax.jit
    def run(h):
        return jax.lax.fori_loop(0, 2, lambda i, h: jax.lax.switch(i, branches, h), h)

    want = np.tanh(np.tanh(x.astype(np.float64) @ w0) @ w1)
    np.testing.assert_allclose(np.asarray(run(jnp.asarray(x))), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("w,match", [
    (np.zeros((8, 40), np.float32), "out a multiple of 32"),
    (np.zeros((8, 64), np.float16), "float32 or bfloat16"),
    (np.zeros((7, 64), jnp.bfloat16), "in even"),
    (np.zeros((2, 8, 64), np.float32), r"\[in, out\]"),
])
def test_pack_weight_rejects_what_the_kernel_cannot_take(w, match):
    with pytest.raises(ValueError, match=match):
        pack_weight(w)


def test_inner_dimension_mismatch_is_an_error():
    x, w = operands(4, 16, 32)
    with pytest.raises(Exception, match="in = x.shape"):
        np.asarray(packed_matmul(jnp.zeros((4, 17)), pack_weight(w)))


def test_packed_method_takes_only_what_the_kernel_can():
    method = PackedLinearMethod()
    assert method.weight_shape(8, (64,)) == (2, 8, 32) and method.supports(8, (64,), jnp.float32)
    assert method.weight_shape(8, (2, 4, 16)) == (4, 8, 32)  # out axes flattened
    assert method.supports(8, (64,), jnp.bfloat16) and not method.supports(7, (64,), jnp.bfloat16)
    assert not method.supports(8, (40,), jnp.float32) and not method.supports(8, (64,), jnp.float16)


def test_fused_weights_give_each_part_its_product():
    # As the model fuses q/k/v: [in, kv heads, group + 2, head_dim], one packed weight.
    rng = np.random.default_rng(3)
    parts = {"wq": rng.standard_normal((16, 64), np.float32), "wk": rng.standard_normal((16, 32), np.float32),
             "wv": rng.standard_normal((16, 32), np.float32)}
    fused = np.concatenate([parts["wq"].reshape(16, 1, 2, 32), parts["wk"].reshape(16, 1, 1, 32),
                            parts["wv"].reshape(16, 1, 1, 32)], axis=2)
    method = PackedLinearMethod()
    packed = method.process_weights_after_loading(jnp.asarray(fused))
    assert packed.shape == method.weight_shape(16, (1, 4, 32))
    x = rng.standard_normal((5, 16), np.float32)
    y = np.asarray(method.apply(jnp.asarray(x), packed)).reshape(5, 1, 4, 32)
    q, k, v = y[:, :, :2].reshape(5, 64), y[:, 0, 2], y[:, 0, 3]
    for got, w in zip((q, k, v), parts.values()):
        np.testing.assert_allclose(got, x.astype(np.float64) @ w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend,packed", [("native", True), ("xla", False)])
def test_worker_packs_only_for_the_native_backend(tiny_model_dir, backend, packed):
    llm = LLM(str(tiny_model_dir), max_num_seqs=2, max_num_batched_tokens=16, max_model_len=32,
              num_gpu_blocks_override=8, skip_warmup=True, attention_backend=backend)
    worker = llm.llm_engine.engine_core.model_executor.driver_worker
    model = worker.model
    assert all("qkv_proj" in layer and "gate_up_proj" in layer and "q_proj" not in layer
               for layer in model.layers)
    assert all((layer["down_proj"].get_value().ndim == 3) == packed for layer in model.layers)
    assert (model.lm_head.get_value().ndim == 3) == packed
    assert isinstance(model.linear_method, PackedLinearMethod if packed else UnquantizedLinearMethod)
    # The tree has the shape it was built with: loading changed no shape and added nothing.
    built = nnx.eval_shape(lambda: LlamaForCausalLM(model.args, linear_method=model.linear_method))
    shapes = lambda m: jax.tree.map(lambda x: x.shape, nnx.to_pure_dict(nnx.state(m)))
    assert shapes(model) == shapes(built)


def test_a_model_the_kernel_cannot_take_runs_xla_matmuls(tmp_path):
    # Vocabulary 250: the head is no whole number of panels, so no weight is packed.
    from conftest import write_tiny_llama

    from jaxvllm.transformers_utils.model_path import default_model_path
    from jaxvllm.transformers_utils.tokenizer import load_tokenizer
    write_tiny_llama(tmp_path, vocab_size=250)
    load_tokenizer(default_model_path()).save_pretrained(tmp_path)
    llm = LLM(str(tmp_path), max_num_seqs=2, max_num_batched_tokens=16, max_model_len=32,
              num_gpu_blocks_override=8, skip_warmup=True, attention_backend="native")
    model = llm.llm_engine.engine_core.model_executor.driver_worker.model
    assert isinstance(model.linear_method, UnquantizedLinearMethod)
    assert model.layers[0]["down_proj"].get_value().shape == (128, 64)
