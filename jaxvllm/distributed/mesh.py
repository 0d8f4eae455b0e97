"""The device mesh an engine runs on.

One axis, "model", carries tensor parallelism (vLLM's `tensor_parallel_size`): weights,
attention heads and the KV cache's KV heads are split over it (by the tables of
logical_axes.py), and XLA's SPMD partitioner inserts the collectives. Its axis type is Auto
(jax 0.10's `make_mesh` defaults to Explicit, under which `with_sharding_constraint`
refuses bare specs).
"""
from __future__ import annotations

import jax
from jax.sharding import AxisType, Mesh

MODEL_AXIS = "model"


def make_mesh(tensor_parallel_size: int, devices=None) -> Mesh:
    """A 1-D mesh over the first `tensor_parallel_size` devices (all processes' devices,
    so a multi-host slice forms one global mesh)."""
    devices = list(jax.devices() if devices is None else devices)
    if not 1 <= tensor_parallel_size <= len(devices):
        raise ValueError(f"tensor_parallel_size must be between 1 and the number of devices "
                         f"({len(devices)}), got {tensor_parallel_size}.")
    return jax.make_mesh((tensor_parallel_size,), (MODEL_AXIS,), axis_types=(AxisType.Auto,),
                         devices=devices[:tensor_parallel_size])
