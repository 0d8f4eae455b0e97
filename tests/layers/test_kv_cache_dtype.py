"""A quantized KV cache (layers/kv_cache_dtype.py) through the model's attention call in every
backend: this step's K/V are written quantized, and attention over the quantized pages
matches the naive oracle on the same pages dequantized. The context comes from the oracle's
poisoned caches (clipped to each format's range), so a read outside a sequence's pages shows."""
from __future__ import annotations

import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernels"))
from conftest import backend_for  # noqa: E402
from naive_attention import assert_matches_naive, build  # noqa: E402

from jaxvllm.kernels.cpu import build as native_build  # noqa: E402
from jaxvllm.layers.attention import AttentionMetadata, get_attention  # noqa: E402
from jaxvllm.layers.kv_cache_dtype import kv_cache_dtype  # noqa: E402

SEQS = [(1, 9), (5, 12), (4, 4), (1, 20)]
# Every format in every backend, fp8 stored as itself (TPU, GPU) and as its bits (the CPU's
# `kv_cache_floats_as_bits`); the native CPU kernel reads float32 and bfloat16 pages and hands a
# quantized cache to the XLA kernel, so one format shows that route.
CASES = [(name, backend, backend == "xla") for name in ("fp8", "fp8_e5m2", "int8")
         for backend in ("xla", "pallas-tpu", "pallas-gpu")]
CASES += [("fp8", "xla", False), ("fp8", "pallas-tpu", True), ("fp8_e5m2", "pallas-gpu", True),
          pytest.param("fp8", "native", True, marks=pytest.mark.skipif(not native_build.available(),
                                                                        reason="no C++ compiler"))]
# Largest error of one stored element: half an int8 step; fp8's relative half-ulp.
WRITE_TOL = {"fp8": dict(rtol=2**-4, atol=1e-2), "fp8_e5m2": dict(rtol=2**-3, atol=1e-3),
             "int8": dict(rtol=0, atol=24 / 127 / 2 + 1e-6)}


def step_metadata(num_tokens, kv_lens, page_indices, cu_q_lens, num_seqs, ps) -> tuple[AttentionMetadata, int]:
    """The metadata of a step writing SEQS' new tokens into their pages, and how many tokens
    are real (padding writes to the null page)."""
    slots = []
    for s, (q_len, kv) in enumerate(SEQS):
        pos = np.arange(kv - q_len, kv)
        slots += list(page_indices[s, pos // ps] * ps + pos % ps)
    real = len(slots)
    md = AttentionMetadata(positions=np.zeros(num_tokens, np.int32),
                           slot_mapping=np.asarray(slots + [0] * (num_tokens - real), np.int32), kv_lens=kv_lens,
                           page_indices=page_indices, cu_q_lens=cu_q_lens, num_seqs=num_seqs)
    return md, real


def dequantized(fmt, cache) -> np.ndarray:
    return np.stack([np.asarray(fmt.dequantize(cache[:, 0], fmt.k_scale)),
                     np.asarray(fmt.dequantize(cache[:, 1], fmt.v_scale))], axis=1)


@pytest.mark.parametrize("name,backend,as_bits", CASES)
def test_attention_over_quantized_pages_matches_reference_on_dequantized_pages(name, backend, as_bits):
    rng = np.random.default_rng(5)
    q, cache, layer, kv_lens, page_indices, cu_q_lens, num_seqs = build(rng, SEQS, nq=4, nkv=2, hd=64, ps=16)
    fmt = kv_cache_dtype(name, jnp.float32, floats_as_bits=as_bits)
    stored = jnp.stack([fmt.quantize(cache[:, 0], fmt.k_scale), fmt.quantize(cache[:, 1], fmt.v_scale)], axis=1)
    assert stored.dtype == fmt.storage and fmt.quantized
    ps = cache.shape[3]
    md, real = step_metadata(q.shape[0], kv_lens, page_indices, cu_q_lens, num_seqs, ps)
    slots = md.slot_mapping
    k, v = (rng.standard_normal((2, q.shape[0], 2, 64)) * 3).astype(np.float32)
    attend = get_attention(backend_for("cpu", backend).attention_impl, kv_dtype=fmt)
    out, stored = attend(q, jnp.asarray(k), jnp.asarray(v), stored, layer, md, 0.125, None)
    assert stored.dtype == fmt.storage
    pages = dequantized(fmt, stored)
    assert_matches_naive(out, (q, pages, layer, kv_lens, page_indices, cu_q_lens, num_seqs), 1e-4,
                         sm_scale=0.125)
    written = pages[int(layer), :, slots[:real] // ps, slots[:real] % ps]  # [tokens, 2, heads, hd]
    np.testing.assert_allclose(written, np.stack([k, v], axis=1)[:real], **WRITE_TOL[name])


@pytest.mark.parametrize("backend", ["xla", "pallas-tpu", "pallas-gpu", pytest.param(
    "native", marks=pytest.mark.skipif(not native_build.available(), reason="no C++ compiler"))])
def test_bfloat16_pages_stored_as_bits_attend_as_bfloat16_pages(backend):
    """The CPU's bfloat16 cache (uint16 bits) gives the bfloat16 cache's output and pages (the
    native kernel reads only the bits, and hands a bfloat16 array to the XLA kernel: outputs
    equal to bfloat16's rounding)."""
    rng = np.random.default_rng(6)
    q, cache, layer, kv_lens, page_indices, cu_q_lens, num_seqs = build(rng, SEQS, nq=4, nkv=2, hd=64, ps=16)
    md, _ = step_metadata(q.shape[0], kv_lens, page_indices, cu_q_lens, num_seqs, cache.shape[3])
    k, v = jnp.asarray(rng.standard_normal((2, q.shape[0], 2, 64)), jnp.bfloat16)
    outs = {}
    for as_bits in (False, True):
        fmt = kv_cache_dtype("auto", jnp.bfloat16, floats_as_bits=as_bits)
        stored = fmt.quantize(jnp.asarray(cache), 1.0)
        assert stored.dtype == (jnp.uint16 if as_bits else jnp.bfloat16)
        attend = get_attention(backend_for("cpu", backend).attention_impl, kv_dtype=fmt)
        out, stored = attend(jnp.asarray(q, jnp.bfloat16), k, v, stored, layer, md, 0.125, None)
        assert stored.dtype == fmt.storage
        outs[as_bits] = (np.asarray(out, np.float32), np.asarray(fmt.dequantize(stored, 1.0)))
    (out, pages), (out_bits, pages_bits) = outs[False], outs[True]
    np.testing.assert_array_equal(pages, pages_bits)
    if backend == "native":
        np.testing.assert_allclose(out_bits, out, rtol=2**-7, atol=2**-7)
    else:
        np.testing.assert_array_equal(out_bits, out)


def test_formats_and_their_storage():
    assert kv_cache_dtype("auto", jnp.bfloat16).dtype == jnp.bfloat16
    assert kv_cache_dtype("auto", jnp.bfloat16, floats_as_bits=True).storage == jnp.uint16
    assert not kv_cache_dtype("auto", jnp.float32, floats_as_bits=True).as_bits
    assert not kv_cache_dtype("auto", jnp.float32).quantized
    assert kv_cache_dtype("fp8", jnp.float32) == kv_cache_dtype("fp8_e4m3", jnp.bfloat16)
    for name in ("fp8", "fp8_e5m2", "int8"):
        for as_bits in (False, True):
            assert kv_cache_dtype(name, jnp.float32, as_bits).storage.itemsize == 1
    assert kv_cache_dtype("fp8", jnp.float32, floats_as_bits=True).storage == jnp.uint8
    assert kv_cache_dtype("int8", jnp.float32, floats_as_bits=True).storage == jnp.int8
    # Values past a format's range are clipped, never NaN or wrapped.
    fmt = kv_cache_dtype("fp8", jnp.float32)
    assert float(fmt.dequantize(fmt.quantize(jnp.float32(1e6), 1.0), 1.0)) == 448.0
    int8 = kv_cache_dtype("int8", jnp.float32)
    assert float(int8.dequantize(int8.quantize(jnp.float32(-1e6), int8.k_scale), int8.k_scale)) == pytest.approx(-24)
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of"):
        kv_cache_dtype("fp4", jnp.float32)


@pytest.mark.parametrize("platform", ["tpu", "cuda"])
@pytest.mark.parametrize("dtype", [jnp.float8_e4m3fn, jnp.float8_e5m2, jnp.int8], ids=lambda d: jnp.dtype(d).name)
def test_pallas_kernels_lower_over_8bit_pages(platform, dtype):
    # On their real targets (Mosaic, Triton), as the accelerators store them: bfloat16
    # queries, 8-bit pages (page_size * kv_heads a multiple of 32 for Mosaic's int8 tiling).
    import functools

    from test_pallas_lowering import MODULES, TARGETS, lower
    args = build(np.random.default_rng(0), SEQS, nq=8, nkv=2, hd=128, ps=32, dtype=jnp.bfloat16)
    args = (args[0], jnp.zeros(args[1].shape, dtype)) + args[2:]
    text = lower(functools.partial(MODULES[platform].ragged_paged_attention, sm_scale=0.1), platform, *args)
    assert TARGETS[platform] in text


def test_bfloat16_engine_generates_alike_with_pages_as_bits(tiny_model_dir, monkeypatch):
    """A bfloat16 model on the CPU (its pages as uint16) gives the tokens of the same engine
    with bfloat16 pages, in a pool too small to hold every request at once. Both with the XLA
    kernel, which takes either storage (the native one reads bits only: tests/kernels)."""
    from jaxvllm import LLM, SamplingParams
    from jaxvllm.platforms.cpu import CpuPlatform

    prompts = [{"prompt_token_ids": list(range(3 + i, 40 + 7 * i))} for i in range(4)]
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    results = []
    for as_bits in (True, False):
        monkeypatch.setattr(CpuPlatform, "kv_cache_floats_as_bits", as_bits)
        llm = LLM(str(tiny_model_dir), dtype="bfloat16", attention_backend="xla", max_model_len=128, block_size=16,
                  num_gpu_blocks_override=12, max_num_batched_tokens=32, skip_warmup=True)
        tokens = [o.outputs[0].token_ids for o in llm.generate(prompts, greedy, use_tqdm=False)]
        llm.llm_engine.shutdown()
        results.append(tokens)
    assert results[0] == results[1]
    assert all(len(t) == 24 for t in results[0])


@pytest.mark.skipif(not native_build.available(), reason="no C++ compiler")
def test_bfloat16_engine_embeds_alike_on_the_native_and_the_xla_kernel(tiny_model_dir):
    """The default CPU path of a bfloat16 model (pages as bits, read by the native kernel)
    against the XLA kernel's, through whole prompts over several pages and chunks."""
    from jaxvllm import LLM

    prompts = [{"prompt_token_ids": list(range(3 + i, 60 + 9 * i))} for i in range(4)]
    embeddings = {}
    for backend in ("native", "xla"):
        llm = LLM(str(tiny_model_dir), runner="pooling", dtype="bfloat16", attention_backend=backend,
                  max_model_len=128, block_size=16, max_num_batched_tokens=32, skip_warmup=True)
        embeddings[backend] = np.stack([np.asarray(o.outputs.embedding, np.float32)
                                        for o in llm.embed(prompts, use_tqdm=False)])
        llm.llm_engine.shutdown()
    cosine = (embeddings["native"] * embeddings["xla"]).sum(-1)  # both normalized
    assert cosine.min() > 0.999, cosine
