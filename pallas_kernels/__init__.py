"""Pallas kernels: ragged paged attention for TPU (Mosaic) and GPU (Triton), and the TPU's
grouped matmul; interpret mode runs either on any device.

A package of its own beside jaxvllm (the design card's layout): it imports jax and nothing
of jaxvllm, so the kernels can be used, tested, benchmarked and lowered on their own. The
contract they share with jaxvllm's XLA and C++ kernels is jaxvllm/kernels/xla/
ragged_paged_attention.py's; jaxvllm/platforms picks which one a model calls."""
