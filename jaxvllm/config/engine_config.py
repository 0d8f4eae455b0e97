"""The resolved, validated configuration the engine runs with (made by
EngineArgs.create_engine_config, engine_args.py), in sections as vLLM's VllmConfig: model,
cache, parallel, scheduler, load, quantization and compilation, and the sections of their own
files (speculative.py, kv_transfer.py, pooler.py). Each part of the engine takes the sections
it needs (the scheduler its SchedulerConfig, the worker the whole config), so a new
capability adds a section instead of threading arguments through every layer. Frozen, and
sent to the engine and worker processes as it is (msgpack, serial_utils).

Each field's default and its docstring (the CLI's help) are written once, here: EngineArgs
takes both. A field whose default differs by device is None ("the platform's") until
create_engine_config fills it from jaxvllm/platforms.
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field

from jaxvllm.config.kv_transfer import KVTransferConfig
from jaxvllm.config.pooler import PoolerConfig
from jaxvllm.config.speculative import SpeculativeConfig
from jaxvllm.config.verify import verify_engine_config
from jaxvllm.layers.quantization.scheme import WeightScheme


@dataclass(frozen=True)
class ModelConfig:
    model: str | None = None
    """A .gguf file, a Hugging Face directory (config.json + *.safetensors), an Orbax
    checkpoint from `jaxvllm convert`, or a Hugging Face Hub id (org/name, or
    org/name/file.gguf); None: the default SmolLM2-135M-Instruct. Prefix-cache keys carry it."""
    path: str = ""
    """The resolved checkpoint on this host: a .gguf file, a Hugging Face or Orbax directory."""
    dtype: str = "auto"
    """Weights and activations: auto (the platform's: float32 on CPU, bfloat16 on GPU/TPU),
    float32, bfloat16 or float16."""
    seed: int = 0
    """Seed from which requests without a seed draw theirs."""
    attention_backend: str = "auto"
    """auto (the platform's kernel), xla, native (C++ on CPU), pallas,
    pallas-tpu or pallas-gpu (interpret mode on a CPU)."""
    runner: str = "auto"
    """generate, or pooling (embeddings, classification, scores: prefill only, no decode);
    auto: pooling for a *ForSequenceClassification checkpoint, else generate."""
    convert: str = "auto"
    """What the pooling runner makes of the model: embed or classify; auto: classify for a
    *ForSequenceClassification checkpoint, else embed."""
    pooler_config: PoolerConfig | None = None
    """The pooling runner's pooler, resolved (every field set); None for generate."""

    @functools.cached_property
    def hf_config(self):
        """The checkpoint's Hugging Face config, read once per process from `path` (not a
        field: it does not cross processes, each one reads it where the checkpoint is)."""
        from jaxvllm.transformers_utils.config import load_hf_config
        return load_hf_config(self.path)

    def with_hf_config(self, hf_config) -> "ModelConfig":
        """This config with its Hugging Face config already read (the caller had it)."""
        self.__dict__["hf_config"] = hf_config  # what the cached property would have stored
        return self

    @property
    def name(self) -> str:
        return self.model or self.path

    @property
    def is_matryoshka(self) -> bool:
        """Whether embeddings may be truncated to fewer `dimensions` (vLLM reads the same
        config fields)."""
        cfg = self.hf_config
        return bool(getattr(cfg, "is_matryoshka", False) or getattr(cfg, "matryoshka_dimensions", None))


@dataclass(frozen=True)
class CacheConfig:
    block_size: int | None = None
    """Tokens per KV cache page (default: the platform's)."""
    hbm_utilization: float = 0.9
    """Fraction of device memory for weights, activations and KV cache, where the device reports it."""
    kv_cache_memory_bytes: int | None = None
    """KV cache size in bytes (default: from hbm_utilization, or the platform's on CPU)."""
    num_gpu_blocks_override: int | None = None
    """Exactly this many KV cache pages."""
    enable_prefix_caching: bool = True
    """Share the KV pages of common prompt prefixes between requests."""
    swap_space: float = 4.0
    """GiB of host memory for preemption_mode=swap."""
    kv_cache_dtype: str = "auto"
    """KV cache storage: auto (the model dtype), fp8 (= fp8_e4m3), fp8_e5m2, or int8 (a fixed
    scale per K and V)."""


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int | None = None
    """Most requests in one step (default: the platform's)."""
    max_num_batched_tokens: int | None = None
    """Token budget of one step; longer prompts are prefilled in chunks (default: the platform's)."""
    max_model_len: int | None = None
    """Longest prompt plus output, in tokens (default: the model's, capped on CPU)."""
    min_token_bucket: int | None = None
    """The smallest token bucket a step is padded to (the platform's)."""
    long_prefill_token_threshold: int = 0
    """Most prompt tokens one request takes per step; 0: bounded by the step's budget only."""
    disable_hybrid_kv_cache_manager: bool = False
    """Keep every page of sliding-window layers too (one block table for all layers), as
    before KV cache groups; for comparisons."""
    scheduling_policy: str = "fcfs"
    """fcfs, or priority (lower `priority` first)."""
    preemption_mode: str = "recompute"
    """What a preempted request loses: recompute (its pages), or swap (to host memory)."""
    async_scheduling: bool | None = None
    """Schedule the next step while the device runs this one (sampled tokens read one step
    later); None: the platform's default. Needs the uni executor on one host, one stage."""


@dataclass(frozen=True)
class ParallelConfig:
    tensor_parallel_size: int = 1
    """Devices the weights, heads and KV cache are split over."""
    enable_expert_parallel: bool = False
    """Mixture-of-experts models: split the experts whole over the tensor-parallel devices
    (EP size = TP size) instead of splitting each expert's features; attention stays
    tensor parallel."""
    nnodes: int = 1
    """Hosts in a multi-host slice (jax.distributed)."""
    node_rank: int = 0
    """This host's rank in the slice; only rank 0 schedules."""
    master_addr: str | None = None
    """Address of host 0, the coordinator (on a TPU VM slice jax may find it itself)."""
    master_port: int = 29501
    """Coordinator port; the schedule broadcast uses the next one."""
    distributed_executor_backend: str = "uni"
    """uni: this process drives all local devices; mp: one worker process per device (a
    crashing worker fails requests cleanly); ray: ray_workers Ray actors (pip install
    jaxvllm[ray]) joined by jax.distributed, on the cluster RAY_ADDRESS names, else a local one."""
    ray_workers: int = 1
    """With distributed_executor_backend=ray: worker actors, one per host or device group, each
    driving tensor_parallel_size / ray_workers devices."""
    pipeline_parallel_size: int = 1
    """Stages the layers are split into, each on its own tensor_parallel_size devices."""
    data_parallel_size: int = 1
    """Engine cores, each in its own process with its own scheduler, KV cache and
    tensor_parallel_size devices; requests go to the least-loaded one."""

    @property
    def is_multiprocess(self) -> bool:
        """Whether the model's devices are driven from more than this process."""
        return self.nnodes > 1 or self.distributed_executor_backend in ("mp", "ray")


@dataclass(frozen=True)
class LoadConfig:
    """Where the checkpoint came from (ModelConfig.path is where it is now)."""
    revision: str | None = None
    """A branch, tag or commit, for a model named by Hugging Face Hub id."""
    download_dir: str | None = None
    """Where Hub models are downloaded (default: the Hugging Face cache)."""


@dataclass(frozen=True)
class QuantizationConfig:
    method: str | None = None
    """int8 or fp8 (weight-only, quantized at load), a quantized checkpoint's method (fp8,
    compressed-tensors, awq, gptq: as stored; gguf: a .gguf file's blocks), None."""
    weights: WeightScheme | None = None
    """The checkpoint's weight scheme (from its config.json); None: float, or a GGUF's own."""


@dataclass(frozen=True)
class CompilationConfig:
    skip_warmup: bool = False
    """Compile each shape on first use instead of at start-up."""
    check_recompilation: bool = False
    """Raise if any program compiles after warm-up."""


@dataclass(frozen=True)
class LoRAConfig:
    """Multi-LoRA serving (vLLM's LoRAConfig): adapters in max_loras device slots of rank up
    to max_lora_rank, max_cpu_loras kept read on the host."""
    max_loras: int = 1
    """Most distinct LoRA adapters in one step (device slots)."""
    max_lora_rank: int = 16
    """Largest LoRA rank an adapter may have (the device stacks' rank)."""
    max_cpu_loras: int | None = None
    """LoRA adapters kept read in host memory (default: max_loras)."""


@dataclass(frozen=True)
class EngineConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    load: LoadConfig = field(default_factory=LoadConfig)
    quant_config: QuantizationConfig = field(default_factory=QuantizationConfig)
    compilation: CompilationConfig = field(default_factory=CompilationConfig)
    speculative: SpeculativeConfig | None = None
    profile_dir: str | None = None
    """Where start_profile() writes jax.profiler traces."""
    lora: LoRAConfig | None = None  # None: enable_lora off (the step is the plain one)
    kv_transfer: KVTransferConfig | None = None  # None: no KV connector

    @property
    def dtype(self) -> str:
        """The model's dtype (model code reads it from the config it is given)."""
        return self.model.dtype

    @property
    def quantization(self) -> str | None:
        """The quantization method's name (vLLM's `quantization`)."""
        return self.quant_config.method

    def verify(self) -> None:
        verify_engine_config(self)

    def replace(self, **changes) -> "EngineConfig":
        return dataclasses.replace(self, **changes)
