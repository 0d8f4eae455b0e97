"""determine_available_memory: how much device memory the KV cache may take, by profiling
(vLLM's profile run). On a device that reports its memory, the budget is that memory times
hbm_utilization (gpu_memory_utilization), less what is already held (the weights), less the
peak of the largest step's temporary buffers, which XLA reports for a compiled program
(`compiled.memory_analysis()`): so warm-up and serving never run out where the budget says
the cache fits. The steps are compiled for it against an abstract KV cache (nothing is
allocated); the persistent compilation cache keeps them for the next start.
"""
from __future__ import annotations

import contextlib
import functools
import logging
from dataclasses import dataclass

import jax

from jaxvllm.worker.compiled_programs import run_on_pool

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class MemoryProfile:
    """Bytes per device."""
    limit: int  # what the device may hold
    in_use: int  # held before the KV cache exists: the weights, mostly
    peak_step: int  # the largest step's temporaries and outputs beyond its arguments

    def kv_cache_budget(self, utilization: float, num_devices: int) -> int:
        """KV cache bytes over the whole mesh (each device holds 1/num_devices of a block)."""
        return (int(self.limit * utilization) - self.in_use - self.peak_step) * num_devices

    def describe(self, utilization: float, num_devices: int) -> str:
        gib = 2 ** 30
        return (f"{self.limit / gib:.2f} GiB x {utilization} - {self.in_use / gib:.2f} GiB in use - "
                f"{self.peak_step / gib:.2f} GiB peak step = "
                f"{self.kv_cache_budget(utilization, 1) / gib:.2f} GiB per device for the KV cache "
                f"({num_devices} device(s))")


# The programs of a step and where their warm-up arguments say their bucket: per token
# bucket (the forward, its LoRA variant, a draft model's forward, EAGLE-3's proposer) or per
# request bucket (the samplers, speculative decoding's verify, a draft model's proposer).
_TOKEN_BUCKETED = {"forward": 2, "forward_lora": 2, "draft_forward": 2, "propose_eagle": 3}
_REQUEST_BUCKETED = {"sample": 3, "sample_extended": 3, "verify": 3, "propose": 2}


def profile_num_blocks(platform, pages_per_request: int, block_bytes: int, free_bytes: int) -> int:
    """Blocks of the abstract pool the profile compiles against (block_bytes and free_bytes
    per device): one request's, and at least the platform's profile_kv_cache_bytes where
    that fits in free_bytes. A TPU's compiler stages a pool that fits on chip in VMEM around
    the KV write, which leaves the step fewer HBM temporaries than it has beside a real pool:
    Llama-3-8B's forward (T=64, fp8 KV, v6e-8) has 23.2 MiB of them at 256 blocks, 40.84 MiB
    at 4,096 and 40.90 at 16,384; a 2-layer model at 32k context, none at its 1,025 blocks
    and 2.36 MiB at 65,536."""
    floor = min(platform.profile_kv_cache_bytes, max(free_bytes, 0)) // max(block_bytes, 1)
    return max(pages_per_request + 1, floor)


def peak_step_bytes(runner, mesh=None) -> int:
    """The most memory one step needs beyond its arguments, per device: each of its programs
    at the largest token or request bucket, compiled (not run, on the runner's compile
    threads) with the runner's abstract or real arguments; the programs after the forward with
    its outputs (their arguments) still held. `mesh`: set while compiling (compile-only
    devices: Mosaic asks the mesh for its TPU)."""
    def bucket(program, args) -> int:
        arg = args[{**_TOKEN_BUCKETED, **_REQUEST_BUCKETED}[program.name]]
        return int(arg) if not hasattr(arg, "shape") or arg.ndim == 0 else arg.shape[0]
    largest = {**dict.fromkeys(_TOKEN_BUCKETED, max(runner.token_buckets)),
               **dict.fromkeys(_REQUEST_BUCKETED, max(runner.request_buckets))}
    chosen = [(p, args, static) for p, args, static in runner.warmup_jobs()
              if p.name in largest and bucket(p, args) == largest[p.name]]

    def analysis(program, args, static):
        with jax.set_mesh(mesh) if mesh is not None else contextlib.nullcontext():
            return program.name, program.jitted.lower(*args, **static).compile().memory_analysis()
    stats = run_on_pool([functools.partial(analysis, *job) for job in chosen], runner.compile_threads)
    if any(s is None for _, s in stats):  # a backend that does not say
        return 0
    forward = max(_outputs(s) for name, s in stats if name == "forward")
    return max(s.temp_size_in_bytes + _outputs(s) + (0 if name in ("forward", "forward_lora") else forward)
               for name, s in stats)


def _outputs(stats) -> int:
    """A program's outputs that are not its donated arguments, updated in place."""
    return stats.output_size_in_bytes - stats.alias_size_in_bytes
