"""get_backend: the one place that asks which device kind an engine runs on to choose its
kernels (vLLM's attention selector, for every kernel the step calls)."""
from __future__ import annotations

from jaxvllm.backends.backend import Backend
from jaxvllm.config import EngineConfig
from jaxvllm.platforms import Platform


def get_backend(config: EngineConfig, platform: Platform) -> Backend:
    """The backend of an engine with this config on this platform (the CUDA one is the base's)."""
    if platform.device_name == "cpu":
        from jaxvllm.backends.cpu import CpuBackend
        return CpuBackend(config, platform)
    if platform.device_name == "tpu":
        from jaxvllm.backends.tpu import TpuBackend
        return TpuBackend(config, platform)
    return Backend(config, platform)
