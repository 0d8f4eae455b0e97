"""Attention and matmul kernels, one folder per way of writing them: `cpu/` (C++ through
XLA's FFI), `pallas/` (Mosaic on TPU, Triton on GPU) and `xla/` (jax.numpy, for XLA to
compile anywhere). They share one contract per operation and import nothing else of
jaxvllm, so each can be used, tested and benchmarked on its own; the platform
(jaxvllm/platforms) picks which one a model calls."""
