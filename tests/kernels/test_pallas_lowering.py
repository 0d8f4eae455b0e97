"""Both Pallas kernels lowered for their real targets on this CPU: Mosaic for a TPU and Triton
for an NVIDIA GPU, through jax.export's cross-platform lowering (an abstract TPU device stands
in for the chip generation the Mosaic lowering asks about).

Nothing here runs a kernel; interpret mode (test_pallas_attention.py) checks the
numbers, and test_native_kernel / scripts/device_check.sh compile and run them where a device
exists. What lowering catches on every CI run is what Pallas rejects before a device sees the
kernel: primitives with no Mosaic or Triton rule, TPU block shapes that break the (8, 128)
tiling, grid, scalar-prefetch and memory-space mistakes. The engine's whole step is lowered
in tests/benchmarks/test_lower_step.py."""
from __future__ import annotations

import contextlib
import functools
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.export import DisabledSafetyCheck
from jax.sharding import AbstractDevice, AbstractMesh

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from naive_attention import MIXED, build  # noqa: E402
from test_pallas_attention import native_cases, native_dtypes  # noqa: E402

from benchmarks import kernels as bench  # noqa: E402
from jaxvllm.distributed.mesh import MODEL_AXIS  # noqa: E402
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
