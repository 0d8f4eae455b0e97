"""Quantization (vLLM's `quantization=`): weight-only int8 or fp8 quantized at load from a
float checkpoint, or a quantized checkpoint's weights kept as stored (fp8 blocks,
compressed-tensors, AWQ, GPTQ, GGUF blocks), each through a linear and a MoE method.

QUANTIZATION_METHODS is the one registry of the names (vLLM's); it imports nothing, so that
the engine's configuration validates them without JAX. checkpoint.py reads a checkpoint's
own method from its config; config.py resolves the method of each named layer; the engine's
backend (jaxvllm/backends) picks the methods that run them.
"""
# int8: quantized at load only; fp8: at load, or an fp8 checkpoint as stored; the rest name
# a checkpoint's format (gguf: a .gguf file's blocks, kept quantized).
QUANTIZATION_METHODS = ("int8", "fp8", "compressed-tensors", "awq", "gptq", "gguf")


def verify_quantization(name: str | None) -> None:
    if name is not None and name not in QUANTIZATION_METHODS:
        raise ValueError(f"quantization must be one of {QUANTIZATION_METHODS} (or None), got {name!r}.")
