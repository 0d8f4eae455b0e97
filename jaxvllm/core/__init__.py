"""Host side of the engine: requests, KV block bookkeeping and the scheduler.

Pure Python by design (no jax import): it decides what runs each step and hands the
worker a `SchedulerOutput`, nothing more.
"""
