"""jaxvllm: vLLM's architecture on JAX/XLA."""
from jaxvllm.sampling_params import SamplingParams
from jaxvllm.outputs import CompletionOutput, RequestOutput

__version__ = "0.1.0"
__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput"]


def __getattr__(name):
    # LLM pulls in jax; importing it lazily keeps `import jaxvllm` (and the host core) light.
    if name == "LLM":
        from jaxvllm.entrypoints.llm import LLM
        return LLM
    raise AttributeError(name)
