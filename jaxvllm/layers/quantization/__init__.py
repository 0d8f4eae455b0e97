"""Quantization at load (vLLM's `quantization=`): weight-only int8 or fp8 linear methods.

The names are vLLM's; jaxvllm/config/ validates them without importing JAX, the platform
(jaxvllm/platforms) picks the linear method that runs them.
"""
