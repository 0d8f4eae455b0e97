"""The kernels and methods an engine's step runs with, chosen once per engine from its
EngineConfig and Platform (`get_backend`) and handed to the worker, the runners,
`aot_compile` and `memory_plan`."""
from jaxvllm.backends.backend import Backend
from jaxvllm.backends.selector import get_backend

__all__ = ["Backend", "get_backend"]
