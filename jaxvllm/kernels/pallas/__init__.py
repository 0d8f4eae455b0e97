"""Pallas kernels: ragged paged attention for TPU (Mosaic) and GPU (Triton); interpret mode
runs either on any device."""
