"""Speculative decoding on the worker: proposers draft tokens on the host, the verify step
scores them with the target model and the rejection sampler accepts them on device."""
