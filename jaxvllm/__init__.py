"""jaxvllm: vLLM's architecture on JAX/XLA."""
from jaxvllm.inputs import TextPrompt, TokensPrompt
from jaxvllm.lora.request import LoRARequest
from jaxvllm.outputs import (
    ClassificationOutput,
    ClassificationRequestOutput,
    CompletionOutput,
    EmbeddingOutput,
    EmbeddingRequestOutput,
    Logprob,
    PoolingOutput,
    PoolingRequestOutput,
    RequestOutput,
    ScoringOutput,
    ScoringRequestOutput,
)
from jaxvllm.pooling_params import PoolingParams
from jaxvllm.sampling_params import BeamSearchParams, RequestOutputKind, SamplingParams, StructuredOutputsParams
from jaxvllm.version import __version__

__all__ = ["LLM", "AsyncLLM", "EngineArgs", "SamplingParams", "StructuredOutputsParams",
           "BeamSearchParams", "RequestOutputKind", "RequestOutput", "CompletionOutput", "Logprob",
           "TextPrompt", "TokensPrompt", "PoolingParams", "PoolingOutput", "PoolingRequestOutput",
           "EmbeddingOutput", "EmbeddingRequestOutput", "ClassificationOutput", "ClassificationRequestOutput",
           "ScoringOutput", "ScoringRequestOutput", "LoRARequest", "__version__"]


def __getattr__(name):
    # LLM and AsyncLLM pull in jax; importing them lazily keeps `import jaxvllm` (and the
    # host core) light.
    if name == "LLM":
        from jaxvllm.entrypoints.llm import LLM
        return LLM
    if name == "AsyncLLM":
        from jaxvllm.engine.async_llm import AsyncLLM
        return AsyncLLM
    if name == "EngineArgs":
        from jaxvllm.config import EngineArgs
        return EngineArgs
    raise AttributeError(name)
