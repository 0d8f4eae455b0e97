"""Pipeline parallelism's layout: which layers each stage holds, and on which devices.

Stage s runs on its own 1-D tensor-parallel mesh, devices [s * tp, (s + 1) * tp) of this
process's devices, so that pipeline_parallel_size * tensor_parallel_size devices are used.
"""
from __future__ import annotations

import jax
from jax.sharding import Mesh

from jaxvllm.distributed.mesh import make_mesh


def stage_layer_ranges(num_layers: int, num_stages: int) -> list[range]:
    """Contiguous layer ranges as even as possible. The layers that do not divide go one
    each to the stages before the last, counting back from it (vLLM's get_pp_indices): the
    last stage also runs the LM head and the sampler. 30 layers in 4 stages: 7, 8, 8, 7."""
    if not 1 <= num_stages <= num_layers:
        raise ValueError(f"pipeline_parallel_size must be between 1 and the model's number of "
                         f"layers ({num_layers}), got {num_stages}.")
    sizes = [num_layers // num_stages] * num_stages
    for i in range(num_layers % num_stages):
        sizes[-2 - i] += 1
    starts = [sum(sizes[:i]) for i in range(num_stages)]
    return [range(start, start + n) for start, n in zip(starts, sizes)]


def stage_meshes(num_stages: int, tensor_parallel_size: int, devices=None) -> list[Mesh]:
    devices = list(jax.devices() if devices is None else devices)
    needed = num_stages * tensor_parallel_size
    if needed > len(devices):
        raise ValueError(f"pipeline_parallel_size x tensor_parallel_size needs {needed} devices; "
                         f"this process has {len(devices)}.")
    return [make_mesh(tensor_parallel_size, devices[s * tensor_parallel_size:])
            for s in range(num_stages)]
