"""Quantization (vLLM's `quantization=`): weight-only int8 or fp8 linear methods and MoE
methods, quantizing float weights at load or keeping a compressed-tensors checkpoint's.

QUANTIZATION_METHODS is the one registry of the names (vLLM's); it imports nothing, so that
the engine's configuration validates them without JAX. config.py resolves the method of each
named layer; the engine's backend (jaxvllm/backends) picks the methods that run them.
"""
QUANTIZATION_METHODS = ("int8", "fp8", "compressed-tensors")


def verify_quantization(name: str | None) -> None:
    if name is not None and name not in QUANTIZATION_METHODS:
        raise ValueError(f"quantization must be one of {QUANTIZATION_METHODS} (or None), got {name!r}.")
