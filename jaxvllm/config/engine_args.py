"""The flags a user sets (`EngineArgs`, vLLM's names), resolved into the EngineConfig the
engine runs with (engine_config.py). As vLLM's, each field defaults to its config section's
field of the same name, whose docstring is its help; the few fields with no section field of
their name are documented here. Defaults that differ by device come from the platform
(jaxvllm/platforms), applied in one place: `_platform_defaults`."""
from __future__ import annotations

import ast
import functools
import inspect
import textwrap
from dataclasses import dataclass, fields

import yaml

from jaxvllm.config.engine_config import (
    CacheConfig,
    CompilationConfig,
    EngineConfig,
    LoadConfig,
    LoRAConfig,
    ModelConfig,
    ParallelConfig,
    QuantizationConfig,
    SchedulerConfig,
)
from jaxvllm.config.kv_transfer import parse_kv_transfer_config
from jaxvllm.config.pooler import resolve_runner
from jaxvllm.config.speculative import parse_speculative_config, resolve_draft_model
from jaxvllm.layers.quantization.checkpoint import resolve_quantization
from jaxvllm.platforms import Platform, get_platform
from jaxvllm.transformers_utils.gguf_utils import is_gguf

# The sections EngineArgs fills field by field, by name.
SECTIONS = (ModelConfig, CacheConfig, SchedulerConfig, ParallelConfig, LoadConfig, CompilationConfig,
            LoRAConfig, EngineConfig)


@dataclass
class EngineArgs:
    """The engine's arguments, with vLLM's names; each one's help: `attribute_docs`."""
    model: str | None = ModelConfig.model
    revision: str | None = LoadConfig.revision
    download_dir: str | None = LoadConfig.download_dir
    dtype: str = ModelConfig.dtype
    max_model_len: int | None = SchedulerConfig.max_model_len
    block_size: int | None = CacheConfig.block_size
    max_num_seqs: int | None = SchedulerConfig.max_num_seqs
    max_num_batched_tokens: int | None = SchedulerConfig.max_num_batched_tokens
    hbm_utilization: float = CacheConfig.hbm_utilization
    gpu_memory_utilization: float | None = None
    """vLLM's name for hbm_utilization."""
    kv_cache_memory_bytes: int | None = CacheConfig.kv_cache_memory_bytes
    num_gpu_blocks_override: int | None = CacheConfig.num_gpu_blocks_override
    seed: int = ModelConfig.seed
    skip_warmup: bool = CompilationConfig.skip_warmup
    quantization: str | None = QuantizationConfig.method
    """Quantize the matmul weights at load, from any float checkpoint: int8 or fp8 (e4m3),
    weight-only with one scale per output channel; None keeps them in dtype. A checkpoint
    quantized already (fp8, compressed-tensors, awq, gptq) is detected from its config.json
    and loads as stored: leave this unset (or name its method). gguf: a .gguf file's weights
    kept in their quantized blocks (unset, they are dequantized to dtype)."""
    kv_cache_dtype: str = CacheConfig.kv_cache_dtype
    attention_backend: str = ModelConfig.attention_backend
    enable_prefix_caching: bool = CacheConfig.enable_prefix_caching
    long_prefill_token_threshold: int = SchedulerConfig.long_prefill_token_threshold
    disable_hybrid_kv_cache_manager: bool = SchedulerConfig.disable_hybrid_kv_cache_manager
    scheduling_policy: str = SchedulerConfig.scheduling_policy
    preemption_mode: str = SchedulerConfig.preemption_mode
    swap_space: float = CacheConfig.swap_space
    profile_dir: str | None = EngineConfig.profile_dir
    check_recompilation: bool = CompilationConfig.check_recompilation
    tensor_parallel_size: int = ParallelConfig.tensor_parallel_size
    enable_expert_parallel: bool = ParallelConfig.enable_expert_parallel
    nnodes: int = ParallelConfig.nnodes
    node_rank: int = ParallelConfig.node_rank
    master_addr: str | None = ParallelConfig.master_addr
    master_port: int = ParallelConfig.master_port
    distributed_executor_backend: str = ParallelConfig.distributed_executor_backend
    ray_workers: int = ParallelConfig.ray_workers
    pipeline_parallel_size: int = ParallelConfig.pipeline_parallel_size
    data_parallel_size: int = ParallelConfig.data_parallel_size
    runner: str = ModelConfig.runner
    convert: str = ModelConfig.convert
    pooler_config: str | None = None
    """The pooling runner's pooler as JSON or a dict, e.g. '{"pooling_type": "MEAN"}':
    pooling_type (LAST, MEAN, CLS, ALL), normalize, softmax, dimensions."""
    async_scheduling: bool | None = SchedulerConfig.async_scheduling
    speculative_config: str | None = None
    """Speculative decoding as JSON or a dict, e.g. '{"method": "ngram",
    "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 5}'; steps then
    run synchronously (no async scheduling)."""
    kv_transfer_config: str | None = None
    """A KV connector as JSON or a dict, e.g. '{"kv_connector": "OffloadingConnector",
    "kv_role": "kv_both", "kv_connector_extra_config": {"num_cpu_blocks": 4096}}' (a host-memory
    tier under the prefix cache: evicted blocks are kept there and reloaded on a hit)."""
    enable_lora: bool = False
    """Serve LoRA adapters (PEFT directories) per request, several in one batch."""
    max_loras: int = LoRAConfig.max_loras
    max_lora_rank: int = LoRAConfig.max_lora_rank
    max_cpu_loras: int | None = LoRAConfig.max_cpu_loras

    @classmethod
    def from_file(cls, path: str, **overrides) -> "EngineArgs":
        """A YAML preset, with explicitly given values taking precedence."""
        with open(path) as f:
            values = yaml.safe_load(f) or {}
        if not isinstance(values, dict):
            raise ValueError(f"Config file {path} must hold a mapping of engine arguments.")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"Config file {path}: unknown engine arguments {unknown}.")
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    def create_engine_config(self, hf_config, backend: str, model_path: str | None = None) -> EngineConfig:
        """hf_config: the checkpoint's Hugging Face config; backend: the JAX backend the engine
        runs on (`jax.default_backend()`), whose platform supplies the defaults that differ by
        device; model_path: the checkpoint resolved on this host (default: `model` as given)."""
        platform = get_platform(backend)
        speculative = resolve_draft_model(parse_speculative_config(self.speculative_config), None,
                                          self.download_dir)
        parallel = _section(ParallelConfig, vars(self))
        values = self._platform_defaults(platform, hf_config, parallel, speculative)
        runner, convert, pooler = resolve_runner(self.runner, self.convert, self.pooler_config, hf_config)
        model = _section(ModelConfig, values, path=model_path or self.model or "", runner=runner, convert=convert,
                         pooler_config=pooler).with_hf_config(hf_config)
        lora = (_section(LoRAConfig, values, max_cpu_loras=self.max_loras if self.max_cpu_loras is None
                         else self.max_cpu_loras) if self.enable_lora else None)
        config = _section(
            EngineConfig, values, model=model, cache=_section(CacheConfig, values), parallel=parallel,
            scheduler=_section(SchedulerConfig, values), load=_section(LoadConfig, values),
            quant_config=QuantizationConfig(*resolve_quantization(self.quantization, hf_config, is_gguf(model.path))),
            compilation=_section(CompilationConfig, values), speculative=speculative, lora=lora,
            kv_transfer=parse_kv_transfer_config(self.kv_transfer_config))
        config.verify()
        return config

    def _platform_defaults(self, platform: Platform, hf_config, parallel: ParallelConfig, speculative) -> dict:
        """These arguments as a dict, those left unset taking the platform's defaults: the one
        place where they apply."""
        values = vars(self).copy()
        model_max = getattr(hf_config, "max_position_embeddings", None) or 2048
        values["max_model_len"] = self.max_model_len or min(model_max, platform.default_max_model_len or model_max)
        if values["max_model_len"] > model_max:
            raise ValueError(f"max_model_len ({values['max_model_len']}) is larger than the model's "
                             f"max_position_embeddings ({model_max}).")
        if self.dtype == "auto":
            values["dtype"] = platform.default_dtype
        elif self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be one of auto, float32, bfloat16, float16; got {self.dtype!r}.")
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens"):
            if values[name] is None:
                values[name] = getattr(platform, f"default_{name}")
        if self.gpu_memory_utilization is not None:
            values["hbm_utilization"] = self.gpu_memory_utilization
        if self.kv_cache_memory_bytes is None and self.num_gpu_blocks_override is None:
            values["kv_cache_memory_bytes"] = platform.default_kv_cache_memory_bytes
        values["min_token_bucket"] = platform.min_token_bucket
        if self.async_scheduling is None:
            values["async_scheduling"] = (platform.default_async_scheduling and not parallel.is_multiprocess
                                          and self.pipeline_parallel_size == 1 and speculative is None)
        return values


def _section(cls, values: dict, **resolved):
    """A config section from the arguments named as its fields; `resolved`: the fields the
    arguments give otherwise."""
    return cls(**{f.name: values[f.name] for f in fields(cls) if f.name in values and f.name not in resolved},
               **resolved)


@functools.cache
def attribute_docs(cls) -> dict[str, str]:
    """Each field's docstring (the string literal under it, as vLLM documents its configs):
    the CLI's help text, written once beside the field. EngineArgs' fields take their section
    field's where they have none of their own."""
    docs = {}
    if cls is EngineArgs:
        for section in SECTIONS:
            docs.update(attribute_docs(section))
    node = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0]
    assert isinstance(node, ast.ClassDef)
    body = node.body
    docs.update({node.target.id: " ".join(doc.value.value.split())
                 for node, doc in zip(body, body[1:])
                 if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                 and isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant)
                 and isinstance(doc.value.value, str)})
    return {name: doc for name, doc in docs.items() if name in {f.name for f in fields(cls)}}
