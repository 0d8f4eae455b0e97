"""Kernels in plain jax.numpy, for XLA to compile on any device: the CPU's attention where
the native kernel cannot run."""
