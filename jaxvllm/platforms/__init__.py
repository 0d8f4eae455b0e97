"""The platform the engine runs on (vLLM's `current_platform`): one object per device kind
holds the facts and defaults that differ by device, so that code elsewhere reads them instead
of asking which device it is on. It imports nothing of jaxvllm above it; the kernels an
engine runs are chosen from it once, by jaxvllm/backends.

`current_platform` is chosen once, from JAX's default backend, when first read; importing
this package initialises no JAX backend (the engine's front-end process never does).
`get_platform(name)` gives any platform's object on any machine, e.g. to lower a step for a
TPU on a CPU.
"""
from __future__ import annotations

import functools
import importlib

from jaxvllm.platforms.interface import Platform

# JAX backend names (and jax.export's platform names) -> the platform's class.
_PLATFORMS = {"cpu": "cpu:CpuPlatform", "gpu": "cuda:CudaPlatform", "cuda": "cuda:CudaPlatform",
              "tpu": "tpu:TpuPlatform"}

__all__ = ["Platform", "current_platform", "get_platform"]


def get_platform(name: str) -> Platform:
    """The platform object for a JAX backend name: `cpu`, `gpu` / `cuda` or `tpu`."""
    if name not in _PLATFORMS:
        raise ValueError(f"No jaxvllm platform for the JAX backend {name!r}; "
                         f"known: {sorted(_PLATFORMS)}.")
    return _load(_PLATFORMS[name])


@functools.cache
def _load(where: str) -> Platform:
    module, cls = where.split(":")
    return getattr(importlib.import_module(f"jaxvllm.platforms.{module}"), cls)()


def __getattr__(name: str):
    if name == "current_platform":
        import jax
        return get_platform(jax.default_backend())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
