"""Attention and matmul kernels that run through XLA, one folder per way of writing them:
`cpu/` (C++ through XLA's FFI) and `xla/` (jax.numpy, for XLA to compile anywhere). The
Pallas kernels (Mosaic on TPU, Triton on GPU) are the top-level package `pallas_kernels`.
They share one contract per operation and import nothing else of jaxvllm, so each can be
used, tested and benchmarked on its own; the engine's backend (jaxvllm/backends) picks which one
a model calls."""
