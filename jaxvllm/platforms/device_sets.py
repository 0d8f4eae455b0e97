"""The devices a data-parallel engine core may use: each core process gets a disjoint set,
written into its environment before JAX starts (JAX reads it once, at backend start-up).
No JAX is imported here: the platform is not known yet, so each platform's variable is set.

- CPU: `--xla_force_host_platform_device_count=<devices per core>`: each core simulates its
  own devices (on one host they share its cores, as separate processes would anyway);
- CUDA: `CUDA_VISIBLE_DEVICES`: the rank's slice of the GPUs this process may see.
- TPU: libtpu's own variables, as vLLM's and tpu-inference's TPU data parallelism set them:
  `TPU_VISIBLE_CHIPS` (the rank's slice of the host's chips, or of those the variable lists),
  each core its own single-process slice (`TPU_PROCESS_BOUNDS=1,1,1`, its own
  `TPU_PROCESS_PORT`) of `TPU_CHIPS_PER_PROCESS_BOUNDS` chips: 1, 2 or 4 in a row, 8 as the
  2 x 4 host of a v5e/v6e.
"""
from __future__ import annotations

import os

_CPU_COUNT_FLAG = "--xla_force_host_platform_device_count"
_TPU_CHIP_BOUNDS = {1: "1,1,1", 2: "1,2,1", 4: "1,4,1", 8: "2,4,1"}
_TPU_BASE_PORT = 8476  # libtpu's default TPU_PROCESS_PORT


def restrict_visible_devices(rank: int, per_rank: int, environ=os.environ) -> None:
    flags = [f for f in environ.get("XLA_FLAGS", "").split() if not f.startswith(_CPU_COUNT_FLAG)]
    environ["XLA_FLAGS"] = " ".join(flags + [f"{_CPU_COUNT_FLAG}={per_rank}"])
    visible = [d for d in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d]
    environ["CUDA_VISIBLE_DEVICES"] = _slice(visible, rank, per_rank, "GPUs", "CUDA_VISIBLE_DEVICES")
    chips = [c for c in environ.get("TPU_VISIBLE_CHIPS", "").split(",") if c]
    port = _TPU_BASE_PORT + rank
    environ.update(TPU_VISIBLE_CHIPS=_slice(chips, rank, per_rank, "TPU chips", "TPU_VISIBLE_CHIPS"),
                   TPU_PROCESS_BOUNDS="1,1,1", TPU_PROCESS_PORT=str(port),
                   TPU_PROCESS_ADDRESSES=f"localhost:{port}", CLOUD_TPU_TASK_ID="0")
    if per_rank in _TPU_CHIP_BOUNDS:  # other counts: libtpu's own error on a TPU host
        environ["TPU_CHIPS_PER_PROCESS_BOUNDS"] = _TPU_CHIP_BOUNDS[per_rank]


def _slice(visible: list[str], rank: int, per_rank: int, what: str, variable: str) -> str:
    """The rank's devices: its slice of those `variable` lists, else of 0, 1, 2, ..."""
    first = rank * per_rank
    if not visible:
        return ",".join(str(i) for i in range(first, first + per_rank))
    if len(visible) < first + per_rank:
        raise ValueError(f"data_parallel_size x tensor_parallel_size needs {first + per_rank} "
                         f"{what}; {variable} lists {len(visible)}.")
    return ",".join(visible[first:first + per_rank])
