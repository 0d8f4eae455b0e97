"""Quantization (vLLM's `quantization=`): weight-only int8 or fp8 linear methods and MoE
methods, quantizing float weights at load or keeping a compressed-tensors checkpoint's.

The names are vLLM's; jaxvllm/config/ validates them without importing JAX (the checkpoint's
format is read by compressed_tensors.py, which imports none either), the platform
(jaxvllm/platforms) picks the methods that run them.
"""
