"""NVIDIA GPUs: the Triton-lowered Pallas attention kernel, bfloat16, no conditionals in a step
(XLA:GPU waits on the host for each one); its kernels are the base backend's
(jaxvllm/backends/backend.py)."""
from __future__ import annotations

from jaxvllm.platforms.interface import Platform


class CudaPlatform(Platform):
    device_name = "cuda"
    pallas_kernel = "gpu"
