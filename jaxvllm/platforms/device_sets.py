"""The devices a data-parallel engine core may use: each core process gets a disjoint set,
written into its environment before JAX starts (JAX reads it once, at backend start-up).
No JAX is imported here: the platform is not known yet, so each platform's variable is set.

- CPU: `--xla_force_host_platform_device_count=<devices per core>`: each core simulates its
  own devices (on one host they share its cores, as separate processes would anyway);
- CUDA: `CUDA_VISIBLE_DEVICES`: the rank's slice of the GPUs this process may see.
"""
from __future__ import annotations

import os

_CPU_COUNT_FLAG = "--xla_force_host_platform_device_count"


def restrict_visible_devices(rank: int, per_rank: int, environ=os.environ) -> None:
    flags = [f for f in environ.get("XLA_FLAGS", "").split() if not f.startswith(_CPU_COUNT_FLAG)]
    environ["XLA_FLAGS"] = " ".join(flags + [f"{_CPU_COUNT_FLAG}={per_rank}"])
    visible = [d for d in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d]
    first = rank * per_rank
    if visible:
        if len(visible) < first + per_rank:
            raise ValueError(f"data_parallel_size x tensor_parallel_size needs {first + per_rank} "
                             f"GPUs; CUDA_VISIBLE_DEVICES lists {len(visible)}.")
        chosen = visible[first:first + per_rank]
    else:
        chosen = [str(i) for i in range(first, first + per_rank)]
    environ["CUDA_VISIBLE_DEVICES"] = ",".join(chosen)
