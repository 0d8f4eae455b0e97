"""Every registered family's step updates the KV cache in place, under both layer loops (the
CPU's fori_loop + switch, and the unrolled one accelerators run), read from the compiled CPU
program: the cache's buffer is aliased input to output, and no temporary of the cache's size
is left (a copy of the pool would be a temporary at least its size; the step's own
temporaries are a small fraction of it at this pool size). A conditional that takes the cache and
returns it updated is what breaks this: XLA then copies the whole pool on every layer.
(Lowered for cuda and tpu, the same steps donate the cache: tests/benchmarks/test_lower_step.py.)"""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.family_configs import ARCHITECTURES, family_args  # noqa: E402
from benchmarks.lower_step import step_runner  # noqa: E402
from benchmarks.model_shapes import TINY  # noqa: E402
from jaxvllm.backends.cpu import CpuBackend  # noqa: E402
from jaxvllm.models.layer_loops import switched_layers, unrolled_layers  # noqa: E402

SHAPE = dataclasses.replace(TINY, num_layers=3)  # Gemma 2 and 3 layers then differ in window
NUM_BLOCKS = 256  # the cache then outweighs the decode step's own temporaries many times over


def compiled_decode_step(arch: str, num_blocks: int, **engine_args):
    """memory_analysis() of the compiled forward for the smallest token bucket, and the
    cache's size in bytes."""
    model_cls, args = family_args(arch, SHAPE, sliding_window=12)
    runner, kv_cache, _ = step_runner("cpu", args, model_cls=model_cls, num_blocks=num_blocks, max_num_seqs=4,
                                      max_num_batched_tokens=16, max_model_len=256, **engine_args)
    program, job_args, static = runner.warmup_jobs()[0]
    assert program.name == "forward"
    compiled = program.jitted.trace(*job_args, **static).lower().compile()
    return compiled.memory_analysis(), kv_cache.size * kv_cache.dtype.itemsize


@pytest.mark.parametrize("loop", [switched_layers, unrolled_layers], ids=["switched", "unrolled"])
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_kv_cache_updated_in_place(arch, loop, monkeypatch):
    monkeypatch.setattr(CpuBackend, "layer_loop", staticmethod(loop))
    memory, kv_bytes = compiled_decode_step(arch, NUM_BLOCKS)
    assert memory.alias_size_in_bytes >= kv_bytes, (arch, memory)
    assert memory.temp_size_in_bytes < kv_bytes / 4, (arch, memory, kv_bytes)


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_bfloat16_and_fp8_caches_updated_in_place(kv_cache_dtype):
    """XLA:CPU writes into a bfloat16 or fp8 array by converting all of it through float32
    (twice per step): the CPU stores those pages as their bits (kv_cache_floats_as_bits)."""
    memory, kv_bytes = compiled_decode_step("LlamaForCausalLM", NUM_BLOCKS, dtype="bfloat16",
                                            kv_cache_dtype=kv_cache_dtype)
    assert memory.alias_size_in_bytes >= kv_bytes, memory
    assert memory.temp_size_in_bytes < kv_bytes / 4, (memory, kv_bytes)
