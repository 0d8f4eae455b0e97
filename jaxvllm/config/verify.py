"""The EngineConfig's checks, each naming the field and its limit: one function per section,
then the rules that span sections (which executors allow async scheduling or swap)."""
from __future__ import annotations

from jaxvllm.config.kv_transfer import verify_kv_transfer
from jaxvllm.config.speculative import verify_speculative
from jaxvllm.layers.quantization import QUANTIZATION_METHODS

# vLLM's names (jaxvllm/layers/quantization, jaxvllm/layers/kv_cache_dtype.py run them).
QUANTIZATIONS = (None, *QUANTIZATION_METHODS)
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2", "int8")


def verify_engine_config(config) -> None:
    _verify_parallel(config.parallel)
    _verify_cache(config.cache)
    _verify_scheduler(config.scheduler)
    if config.quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {QUANTIZATIONS}, got {config.quantization!r}.")
    verify_target_model(config.model.hf_config, config.model.name)
    verify_speculative(config)
    verify_kv_transfer(config)
    c, p, s = config.compilation, config.parallel, config.scheduler
    if config.model.runner == "pooling" and p.pipeline_parallel_size > 1:
        raise ValueError("runner='pooling' needs pipeline_parallel_size=1 (the pooler reads the last "
                         "stage's hidden states in the runner that pools them).")
    if c.check_recompilation and c.skip_warmup:
        raise ValueError("check_recompilation needs the warm-up; do not combine it with skip_warmup.")
    if config.lora is not None:
        _verify_lora(config)
    if (p.is_multiprocess or p.pipeline_parallel_size > 1) and s.async_scheduling:
        raise ValueError("async_scheduling needs distributed_executor_backend='uni', nnodes=1 and "
                         "pipeline_parallel_size=1 (the step's tokens stay on this process's devices).")
    if p.is_multiprocess and s.preemption_mode == "swap":
        raise ValueError("preemption_mode='swap' is not supported with nnodes > 1 or the 'mp' "
                         "or 'ray' executor (the swap pool lives in one process); use 'recompute'.")
    if p.pipeline_parallel_size > 1 and s.preemption_mode == "swap":
        raise ValueError("preemption_mode='swap' is not supported with pipeline_parallel_size > 1 "
                         "(each stage holds its own KV cache); use 'recompute'.")


def verify_target_model(hf_config, name: str) -> None:
    """A draft head cannot be served on its own (checked before its tokenizer is looked for)."""
    from jaxvllm.models.registry import is_draft_model
    if is_draft_model(hf_config):
        raise ValueError(f"{name} is a draft head ({hf_config.architectures}); serve its target model with "
                         "speculative_config={'method': 'eagle3', 'model': ...}.")


def _verify_lora(config) -> None:
    lora = config.lora
    if lora.max_loras < 1:
        raise ValueError(f"max_loras must be at least 1, got {lora.max_loras}.")
    if lora.max_lora_rank < 1:
        raise ValueError(f"max_lora_rank must be at least 1, got {lora.max_lora_rank}.")
    if lora.max_cpu_loras < lora.max_loras:
        raise ValueError(f"max_cpu_loras ({lora.max_cpu_loras}) must be at least max_loras ({lora.max_loras}).")
    if config.model.runner == "pooling":
        raise ValueError("enable_lora needs runner='generate' (pooling models serve no adapters).")
    if config.parallel.pipeline_parallel_size > 1:
        raise ValueError("enable_lora needs pipeline_parallel_size=1.")
    if config.speculative is not None:
        raise ValueError("enable_lora does not combine with speculative_config yet (the verify step "
                         "runs the base model's projections only).")


def _verify_parallel(p) -> None:
    if p.tensor_parallel_size < 1:
        raise ValueError(f"tensor_parallel_size must be at least 1, got {p.tensor_parallel_size}.")
    if p.data_parallel_size < 1:
        raise ValueError(f"data_parallel_size must be at least 1, got {p.data_parallel_size}.")
    if p.data_parallel_size > 1 and p.nnodes > 1:
        raise ValueError("data_parallel_size > 1 runs its engine cores on one host; use nnodes=1.")
    if p.pipeline_parallel_size < 1:
        raise ValueError(f"pipeline_parallel_size must be at least 1, got {p.pipeline_parallel_size}.")
    if p.pipeline_parallel_size > 1 and (p.nnodes > 1 or p.distributed_executor_backend != "uni"):
        raise ValueError("pipeline_parallel_size > 1 runs its stages from one process: use "
                         "distributed_executor_backend='uni' and nnodes=1.")
    if p.nnodes < 1:
        raise ValueError(f"nnodes must be at least 1, got {p.nnodes}.")
    if not 0 <= p.node_rank < p.nnodes:
        raise ValueError(f"node_rank must be in [0, nnodes={p.nnodes}), got {p.node_rank}.")
    if not 0 < p.master_port < 65535:  # the next port carries the schedule broadcast
        raise ValueError(f"master_port must be in [1, 65534], got {p.master_port}.")
    if p.distributed_executor_backend not in ("uni", "mp", "ray"):
        raise ValueError(f"distributed_executor_backend must be 'uni', 'mp' or 'ray', "
                         f"got {p.distributed_executor_backend!r}.")
    if p.distributed_executor_backend in ("mp", "ray") and p.nnodes > 1:
        raise ValueError(f"distributed_executor_backend={p.distributed_executor_backend!r} starts its "
                         f"own workers (on the Ray cluster's hosts for 'ray'); use nnodes=1.")
    if p.ray_workers < 1 or p.tensor_parallel_size % p.ray_workers:
        raise ValueError(f"ray_workers must be at least 1 and divide tensor_parallel_size "
                         f"({p.tensor_parallel_size}), got {p.ray_workers}.")


def _verify_cache(c) -> None:
    if c.kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {c.kv_cache_dtype!r}.")
    if c.block_size not in (8, 16, 32, 64, 128, 256):
        raise ValueError(f"block_size must be one of 8, 16, 32, 64, 128, 256; got {c.block_size}.")
    if not 0.0 < c.hbm_utilization <= 1.0:
        raise ValueError(f"hbm_utilization must be in (0, 1], got {c.hbm_utilization}.")
    if c.num_gpu_blocks_override is not None and c.num_gpu_blocks_override < 2:
        raise ValueError(f"num_gpu_blocks_override must be at least 2, got {c.num_gpu_blocks_override}.")
    if c.kv_cache_memory_bytes is not None and c.kv_cache_memory_bytes <= 0:
        raise ValueError(f"kv_cache_memory_bytes must be positive, got {c.kv_cache_memory_bytes}.")
    if c.swap_space < 0:
        raise ValueError(f"swap_space must not be negative, got {c.swap_space}.")


def _verify_scheduler(s) -> None:
    if s.max_num_seqs < 1:
        raise ValueError(f"max_num_seqs must be at least 1, got {s.max_num_seqs}.")
    if s.max_num_batched_tokens < s.max_num_seqs:
        raise ValueError(f"max_num_batched_tokens ({s.max_num_batched_tokens}) must be at least "
                         f"max_num_seqs ({s.max_num_seqs}).")
    if s.scheduling_policy not in ("fcfs", "priority"):
        raise ValueError(f"scheduling_policy must be 'fcfs' or 'priority', got {s.scheduling_policy!r}.")
    if s.preemption_mode not in ("recompute", "swap"):
        raise ValueError(f"preemption_mode must be 'recompute' or 'swap', got {s.preemption_mode!r}.")
    if s.long_prefill_token_threshold < 0:
        raise ValueError(f"long_prefill_token_threshold must not be negative, "
                         f"got {s.long_prefill_token_threshold}.")
    if s.max_model_len < 2:
        raise ValueError(f"max_model_len must be at least 2, got {s.max_model_len}.")
