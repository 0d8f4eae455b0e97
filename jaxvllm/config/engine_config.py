"""The resolved, validated configuration the engine runs with (made by
EngineArgs.create_engine_config, engine_args.py), in sections as vLLM's VllmConfig: model,
cache, parallel, scheduler, load, quantization and compilation. Each part of the engine takes
the sections it needs (the scheduler its SchedulerConfig, the worker the whole config), so a
new capability adds a section (speculative decoding's draft model, LoRA) instead of threading
arguments through every layer. Frozen, and sent to the engine and worker processes as it is
(msgpack, serial_utils)."""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field

from jaxvllm.config.verify import verify_engine_config
from jaxvllm.layers.quantization import QUANTIZATION_METHODS

# vLLM's names (jaxvllm/layers/quantization, jaxvllm/layers/kv_cache_dtype.py run them).
QUANTIZATIONS = (None, *QUANTIZATION_METHODS)
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2", "int8")


@dataclass(frozen=True)
class PoolerConfig:
    """How a pooling model pools (vLLM's PoolerConfig): the hidden states of the LAST token,
    their MEAN, the first (CLS) token's, or ALL of them; L2-`normalize` embeddings; `softmax`
    a classifier's labels (its `use_activation`); `dimensions`: the Matryoshka default.
    None: the convert's default (embed: LAST, normalized; classify: LAST, softmax)."""
    pooling_type: str | None = None
    normalize: bool | None = None
    softmax: bool | None = None
    dimensions: int | None = None


@dataclass(frozen=True)
class ModelConfig:
    model: str | None = None
    """The model as the user named it (None: the default); prefix-cache keys carry it."""
    path: str = ""
    """The resolved checkpoint on this host: a .gguf file, a Hugging Face or Orbax directory."""
    dtype: str = "float32"
    seed: int = 0
    attention_backend: str = "auto"
    runner: str = "generate"
    """generate (sample tokens) or pooling (a pooled hidden state per prompt, no decode)."""
    convert: str = "none"
    """What a pooling runner makes of the model: embed, or classify (a score head)."""
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
    block_size: int = 16
    hbm_utilization: float = 0.9
    kv_cache_memory_bytes: int | None = None
    num_gpu_blocks_override: int | None = None
    enable_prefix_caching: bool = True
    swap_space: float = 4.0
    kv_cache_dtype: str = "auto"


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 32
    max_num_batched_tokens: int = 512
    max_model_len: int = 2048
    min_token_bucket: int = 16
    long_prefill_token_threshold: int = 0
    disable_hybrid_kv_cache_manager: bool = False  # sliding layers keep every page (one group)
    scheduling_policy: str = "fcfs"
    preemption_mode: str = "recompute"
    async_scheduling: bool = False


@dataclass(frozen=True)
class ParallelConfig:
    tensor_parallel_size: int = 1
    enable_expert_parallel: bool = False
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str | None = None
    master_port: int = 29501
    distributed_executor_backend: str = "uni"
    ray_workers: int = 1
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1

    @property
    def is_multiprocess(self) -> bool:
        """Whether the model's devices are driven from more than this process."""
        return self.nnodes > 1 or self.distributed_executor_backend in ("mp", "ray")


@dataclass(frozen=True)
class LoadConfig:
    """Where the checkpoint came from (ModelConfig.path is where it is now)."""
    revision: str | None = None
    download_dir: str | None = None


@dataclass(frozen=True)
class QuantizationConfig:
    method: str | None = None
    """int8 or fp8 (weight-only, quantized at load), compressed-tensors (as stored), None."""


@dataclass(frozen=True)
class CompilationConfig:
    skip_warmup: bool = False
    check_recompilation: bool = False


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding (vLLM's `speculative_config`): a proposer drafts up to
    `num_speculative_tokens` tokens per request per step, the target model verifies them in
    one forward and the rejection sampler keeps the target's distribution (worker/spec_decode).
    ngram: prompt lookup, the longest suffix n-gram of prompt_lookup_min..max tokens that
    appeared earlier in the request proposes the tokens that followed it (vLLM's defaults:
    one bound unset takes the other's value, both unset are 5).
    suffix: suffix decoding over the request's prompt and the responses of it and of the last
    suffix_decoding_max_cached_requests requests, matched up to suffix_decoding_max_tree_depth
    tokens back; a match of m tokens drafts up to m * suffix_decoding_max_spec_factor tokens,
    while the draft's path probability stays >= suffix_decoding_min_token_prob (vLLM's names
    and defaults; num_speculative_tokens unset: the tree depth, at most 16 here).
    draft_model: `model`, a smaller checkpoint with the target's vocabulary, runs in the same
    worker on the same mesh, its KV in the target's pool, and drafts greedily, k tokens per
    step in one compiled program (worker/spec_decode/draft_model.py)."""
    method: str = "ngram"
    num_speculative_tokens: int = 4
    model: str | None = None
    """The draft model of method draft_model (a path or hub id, resolved to a local path)."""
    prompt_lookup_min: int = 5
    prompt_lookup_max: int = 5
    suffix_decoding_max_tree_depth: int = 24
    suffix_decoding_max_cached_requests: int = 10000
    suffix_decoding_max_spec_factor: float = 1.0
    suffix_decoding_min_token_prob: float = 0.1


@dataclass(frozen=True)
class LoRAConfig:
    """Multi-LoRA serving (vLLM's LoRAConfig): adapters in max_loras device slots of rank up
    to max_lora_rank, max_cpu_loras kept read on the host."""
    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: int = 1


@dataclass(frozen=True)
class KVTransferConfig:
    """A KV connector (vLLM's `kv_transfer_config`, distributed/kv_transfer): `kv_connector`
    names it, `kv_role` is kv_producer, kv_consumer or kv_both, `kv_connector_extra_config`
    holds its own settings (OffloadingConnector: num_cpu_blocks or cpu_bytes_to_use,
    num_staging_blocks; JaxTransferConnector: pull_timeout_s, send_timeout_s,
    num_send_blocks). kv_ip and kv_port: where a prefill engine's side channel listens
    (vLLM's defaults)."""
    kv_connector: str | None = None
    kv_role: str = "kv_both"
    kv_connector_extra_config: dict = field(default_factory=dict)
    kv_ip: str = "127.0.0.1"
    kv_port: int = 14579


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
