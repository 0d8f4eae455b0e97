"""Both Pallas kernels lowered for their real targets on this CPU: Mosaic for a TPU and Triton
for an NVIDIA GPU, through jax.export's cross-platform lowering (an abstract TPU device stands
in for the chip generation the Mosaic lowering asks about).

Nothing here runs a kernel; interpret mode (test_ragged_paged_attention_kernels.py) checks the
numbers, and test_native_kernel / scripts/device_check.sh compile and run them where a device
exists. What lowering catches on every CI run is what Pallas rejects before a device sees the
kernel: primitives with no Mosaic or Triton rule, TPU block shapes that break the (8, 128)
tiling, grid, scalar-prefetch and memory-space mistakes, and, at model level, the wiring that
`attention_backend="auto"` picks on each platform."""
from __future__ import annotations

import contextlib
import functools
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.export import DisabledSafetyCheck
from jax.sharding import AbstractDevice, AbstractMesh

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "layers"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from test_ragged_paged_attention_kernels import native_cases, native_dtypes  # noqa: E402
from test_reference_attention import MIXED, build  # noqa: E402

from benchmarks import kernels as bench  # noqa: E402
from jaxvllm.distributed.mesh import MODEL_AXIS  # noqa: E402
from jaxvllm.layers.attention import AttentionMetadata, get_attention  # noqa: E402
from jaxvllm.models.llama import LlamaArgs, LlamaForCausalLM  # noqa: E402
from pallas_kernels import ragged_paged_attention_gpu as gpu  # noqa: E402
from pallas_kernels import ragged_paged_attention_tpu as tpu  # noqa: E402

# The custom call each lowering ends in (its kernel travels inside it as MLIR).
TARGETS = {"tpu": "tpu_custom_call", "cuda": "__gpu$xla.gpu.triton"}
KERNEL_NAMES = {"tpu": "ragged_paged_attention_tpu", "cuda": "ragged_paged_attention_gpu"}
MODULES = {"tpu": tpu, "cuda": gpu}


def lower(fn, platform: str, *args, tpu_kind: str = "TPU v5 lite") -> str:
    """StableHLO text of jit(fn) lowered for `platform`; args may be arrays or shape structs."""
    specs = jax.tree.map(lambda a: jax.ShapeDtypeStruct(np.shape(a), a.dtype), args)
    chip = contextlib.nullcontext()
    if platform == "tpu":
        device = AbstractDevice(device_kind=tpu_kind, num_cores=1, platform="tpu")
        chip = jax.sharding.use_abstract_mesh(AbstractMesh((1,), (MODEL_AXIS,), abstract_device=device))
    with chip:
        exported = jax.export.export(jax.jit(fn), platforms=[platform], disabled_checks=[
            DisabledSafetyCheck.custom_call(TARGETS[platform])])(*specs)
    return exported.mlir_module()


platforms = pytest.mark.parametrize("platform", ["tpu", "cuda"])


@platforms
@native_dtypes
@native_cases
def test_kernel_lowers(platform, seqs, nq, nkv, hd, ps, window, cap, dtype):
    args = build(np.random.default_rng(0), seqs, nq=nq, nkv=nkv, hd=hd, ps=ps, dtype=dtype)
    fn = functools.partial(MODULES[platform].ragged_paged_attention, sm_scale=hd ** -0.5,
                           sliding_window=window, soft_cap=cap)
    text = lower(fn, platform, *args)
    assert f"@{TARGETS[platform]}" in text and KERNEL_NAMES[platform] in text
    # Nothing around the kernel loops: an XLA while loop on a GPU launches its body's kernels
    # once per trip, on every attention call (the work list's binary search was one).
    assert "stablehlo.while" not in text


@pytest.mark.parametrize("kind", ["TPU v4", "TPU v5 lite", "TPU v6 lite"])
def test_tpu_kernel_lowers_for_each_generation(kind):
    args = build(np.random.default_rng(1), MIXED, nq=9, nkv=3, hd=64, ps=16, dtype=jnp.bfloat16)
    text = lower(functools.partial(tpu.ragged_paged_attention, sm_scale=0.125), "tpu", *args,
                 tpu_kind=kind)
    assert "@tpu_custom_call" in text


def bench_case(seqs, page_size):
    """Shapes of a benchmarks/kernels.py case (Llama-3-8B-like heads, bfloat16), unallocated."""
    return jax.eval_shape(lambda: bench.make_case(np.random.default_rng(0), seqs, page_size, jnp.bfloat16))


@platforms
@pytest.mark.parametrize("case", range(len(bench.CASES)), ids=[
    f"{kind}-{len(seqs)}x{seqs[-1][1]}-ps{ps}" for kind, seqs, ps in bench.CASES])
def test_benchmark_cases_lower(platform, case):
    """Every shape scripts/device_check.sh times, at the default block sizes."""
    _, seqs, page_size = bench.CASES[case]
    fn = functools.partial(MODULES[platform].ragged_paged_attention, sm_scale=bench.HD ** -0.5)
    assert f"@{TARGETS[platform]}" in lower(fn, platform, *bench_case(seqs, page_size))


@pytest.mark.parametrize("kernel,platform", [("gpu", "cuda"), ("tpu", "tpu")])
def test_benchmark_sweep_options_lower(kernel, platform):
    """Every block-size option `benchmarks/kernels.py --sweep` tries on a device."""
    args = bench_case([(1, 2048)] * 64, 16)
    for options in bench.SWEEP[kernel]:
        fn = functools.partial(MODULES[platform].ragged_paged_attention, sm_scale=bench.HD ** -0.5, **options)
        assert f"@{TARGETS[platform]}" in lower(fn, platform, *args), options


@platforms
def test_default_model_forward_lowers(platform):
    """The default model's forward (SmolLM2-135M shapes: 30 layers, 9 query / 3 KV heads,
    head_dim 64) with the attention `auto` picks on that platform, lowered for a 64-token step
    of 8 sequences. Abstract weights: nothing is allocated."""
    args = LlamaArgs(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30,
                     num_heads=9, num_kv_heads=3, head_dim=64, rms_norm_eps=1e-5,
                     rope_theta=100000.0, rope_scaling=None, tie_word_embeddings=True,
                     attention_bias=False, max_position_embeddings=8192)
    model = nnx.eval_shape(lambda: LlamaForCausalLM(args, dtype=jnp.bfloat16))
    graphdef, params = nnx.split(model)
    attend = get_attention("auto", platform)
    tokens, seqs, pages, page_size = 64, 8, 64, 16

    def forward(params, input_ids, kv_cache, md):
        hidden, kv_cache = nnx.merge(graphdef, params)(input_ids, kv_cache, md, attend)
        return nnx.merge(graphdef, params).compute_logits(hidden[:seqs]), kv_cache

    i32 = functools.partial(jax.ShapeDtypeStruct, dtype=jnp.int32)
    md = AttentionMetadata(positions=i32((tokens,)), slot_mapping=i32((tokens,)),
                           kv_lens=i32((seqs,)), page_indices=i32((seqs, 8)),
                           cu_q_lens=i32((seqs + 1,)), num_seqs=i32((1,)))
    kv = jax.ShapeDtypeStruct((30, 2, pages, page_size, 3, 64), jnp.bfloat16)
    text = lower(forward, platform, params, i32((tokens,)), kv, md)
    # Attention is compiled once, inside the layer loop: one kernel call in the module.
    assert text.count(f"@{TARGETS[platform]}(") == 1
