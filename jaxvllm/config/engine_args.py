"""The flags a user sets (`EngineArgs`, vLLM's names), resolved into the EngineConfig the
engine runs with (engine_config.py). Defaults live here, and those that differ by device in
the platform (jaxvllm/platforms)."""
from __future__ import annotations

import ast
import functools
import inspect
import textwrap
from dataclasses import dataclass, fields

import yaml

from jaxvllm.config.engine_config import (CacheConfig, CompilationConfig, EngineConfig, LoadConfig,
                                          LoRAConfig, ModelConfig, ParallelConfig, QuantizationConfig,
                                          SchedulerConfig)
from jaxvllm.config.pooler import resolve_runner
from jaxvllm.config.kv_transfer import parse_kv_transfer_config
from jaxvllm.config.speculative import parse_speculative_config, resolve_draft_model
from jaxvllm.layers.quantization.compressed_tensors import resolve_quantization
from jaxvllm.platforms import get_platform


@dataclass
class EngineArgs:
    """The engine's arguments, with vLLM's names. Each one's docstring is its --help text;
    "the platform's" defaults come from jaxvllm/platforms (CPU, CUDA, TPU)."""
    model: str | None = None
    """A .gguf file, a Hugging Face directory (config.json + *.safetensors), an Orbax
    checkpoint from `jaxvllm convert`, or a Hugging Face Hub id (org/name, or
    org/name/file.gguf); None: the default SmolLM2-135M-Instruct."""
    revision: str | None = None
    """A branch, tag or commit, for a model named by Hugging Face Hub id."""
    download_dir: str | None = None
    """Where Hub models are downloaded (default: the Hugging Face cache)."""
    dtype: str = "auto"
    """Weights and activations: auto (the platform's: float32 on CPU, bfloat16 on GPU/TPU),
    float32, bfloat16 or float16."""
    max_model_len: int | None = None
    """Longest prompt plus output, in tokens (default: the model's, capped on CPU)."""
    block_size: int | None = None
    """Tokens per KV cache page (default: the platform's)."""
    max_num_seqs: int | None = None
    """Most requests in one step (default: the platform's)."""
    max_num_batched_tokens: int | None = None
    """Token budget of one step; longer prompts are prefilled in chunks (default: the platform's)."""
    hbm_utilization: float = 0.9
    """Fraction of device memory for weights, activations and KV cache, where the device reports it."""
    gpu_memory_utilization: float | None = None
    """vLLM's name for hbm_utilization."""
    kv_cache_memory_bytes: int | None = None
    """KV cache size in bytes (default: from hbm_utilization, or the platform's on CPU)."""
    num_gpu_blocks_override: int | None = None
    """Exactly this many KV cache pages."""
    seed: int = 0
    """Seed from which requests without a seed draw theirs."""
    skip_warmup: bool = False
    """Compile each shape on first use instead of at start-up."""
    quantization: str | None = None
    """Quantize the matmul weights at load, from any float checkpoint: int8 or fp8 (e4m3),
    weight-only with one scale per output channel; None keeps them in dtype. A checkpoint
    quantized already (compressed-tensors fp8 or int8) is detected from its config.json and
    loads as stored: leave this unset (or name its method, compressed-tensors)."""
    kv_cache_dtype: str = "auto"
    """KV cache storage: auto (the model dtype), fp8 (= fp8_e4m3), fp8_e5m2, or int8 (a fixed
    scale per K and V)."""
    attention_backend: str = "auto"
    """auto (the platform's kernel), xla, native (C++ on CPU), pallas,
    pallas-tpu or pallas-gpu (interpret mode on a CPU)."""
    enable_prefix_caching: bool = True
    """Share the KV pages of common prompt prefixes between requests."""
    long_prefill_token_threshold: int = 0
    """Most prompt tokens one request takes per step; 0: bounded by the step's budget only."""
    disable_hybrid_kv_cache_manager: bool = False
    """Keep every page of sliding-window layers too (one block table for all layers), as
    before KV cache groups; for comparisons."""
    scheduling_policy: str = "fcfs"
    """fcfs, or priority (lower `priority` first)."""
    preemption_mode: str = "recompute"
    """What a preempted request loses: recompute (its pages), or swap (to host memory)."""
    swap_space: float = 4.0
    """GiB of host memory for preemption_mode=swap."""
    profile_dir: str | None = None
    """Where start_profile() writes jax.profiler traces."""
    check_recompilation: bool = False
    """Raise if any program compiles after warm-up."""
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
    runner: str = "auto"
    """generate, or pooling (embeddings, classification, scores: prefill only, no decode);
    auto: pooling for a *ForSequenceClassification checkpoint, else generate."""
    convert: str = "auto"
    """What the pooling runner makes of the model: embed or classify; auto: classify for a
    *ForSequenceClassification checkpoint, else embed."""
    pooler_config: str | None = None
    """The pooling runner's pooler as JSON or a dict, e.g. '{"pooling_type": "MEAN"}':
    pooling_type (LAST, MEAN, CLS, ALL), normalize, softmax, dimensions."""
    async_scheduling: bool | None = None
    """Schedule the next step while the device runs this one (sampled tokens read one step
    later); None: the platform's default. Needs the uni executor on one host, one stage."""
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
    max_loras: int = 1
    """Most distinct LoRA adapters in one step (device slots)."""
    max_lora_rank: int = 16
    """Largest LoRA rank an adapter may have (the device stacks' rank)."""
    max_cpu_loras: int | None = None
    """LoRA adapters kept read in host memory (default: max_loras)."""

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

    def create_engine_config(self, hf_config, backend: str, model_path: str | None = None) -> "EngineConfig":
        """hf_config: the checkpoint's Hugging Face config; backend: the JAX backend the engine
        runs on (`jax.default_backend()`), whose platform supplies the defaults that differ by
        device; model_path: the checkpoint resolved on this host (default: `model` as given)."""
        platform = get_platform(backend)
        model_max = getattr(hf_config, "max_position_embeddings", None) or 2048
        max_model_len = self.max_model_len or min(model_max, platform.default_max_model_len or model_max)
        if max_model_len > model_max:
            raise ValueError(f"max_model_len ({max_model_len}) is larger than the model's "
                             f"max_position_embeddings ({model_max}).")
        if self.dtype == "auto":
            dtype = platform.default_dtype
        elif self.dtype in ("float32", "bfloat16", "float16"):
            dtype = self.dtype
        else:
            raise ValueError(f"dtype must be one of auto, float32, bfloat16, float16; got {self.dtype!r}.")
        hbm = self.gpu_memory_utilization if self.gpu_memory_utilization is not None else self.hbm_utilization
        parallel = ParallelConfig(
            tensor_parallel_size=self.tensor_parallel_size, enable_expert_parallel=self.enable_expert_parallel,
            nnodes=self.nnodes, node_rank=self.node_rank, master_addr=self.master_addr,
            master_port=self.master_port, distributed_executor_backend=self.distributed_executor_backend,
            ray_workers=self.ray_workers, pipeline_parallel_size=self.pipeline_parallel_size,
            data_parallel_size=self.data_parallel_size)
        cache = CacheConfig(
            block_size=platform.default_block_size if self.block_size is None else self.block_size,
            hbm_utilization=hbm,
            kv_cache_memory_bytes=(self.kv_cache_memory_bytes if self.kv_cache_memory_bytes is not None
                                   or self.num_gpu_blocks_override is not None
                                   else platform.default_kv_cache_memory_bytes),
            num_gpu_blocks_override=self.num_gpu_blocks_override,
            enable_prefix_caching=self.enable_prefix_caching,
            swap_space=self.swap_space,
            kv_cache_dtype=self.kv_cache_dtype,
        )
        speculative = resolve_draft_model(parse_speculative_config(self.speculative_config), None,
                                          self.download_dir)
        sched = SchedulerConfig(
            max_num_seqs=self.max_num_seqs or platform.default_max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens or platform.default_max_num_batched_tokens,
            max_model_len=max_model_len,
            min_token_bucket=platform.min_token_bucket,
            long_prefill_token_threshold=self.long_prefill_token_threshold,
            disable_hybrid_kv_cache_manager=self.disable_hybrid_kv_cache_manager,
            scheduling_policy=self.scheduling_policy,
            preemption_mode=self.preemption_mode,
            async_scheduling=(self.async_scheduling if self.async_scheduling is not None
                              else platform.default_async_scheduling and not parallel.is_multiprocess
                              and self.pipeline_parallel_size == 1 and speculative is None),
        )
        runner, convert, pooler = resolve_runner(self.runner, self.convert, self.pooler_config, hf_config)
        model = ModelConfig(model=self.model, path=model_path or self.model or "", dtype=dtype, seed=self.seed,
                            attention_backend=self.attention_backend, runner=runner, convert=convert,
                            pooler_config=pooler).with_hf_config(hf_config)
        config = EngineConfig(
            model=model, cache=cache, parallel=parallel, scheduler=sched,
            load=LoadConfig(revision=self.revision, download_dir=self.download_dir),
            quant_config=QuantizationConfig(resolve_quantization(self.quantization, hf_config)),
            compilation=CompilationConfig(skip_warmup=self.skip_warmup,
                                          check_recompilation=self.check_recompilation),
            speculative=speculative, profile_dir=self.profile_dir,
            kv_transfer=parse_kv_transfer_config(self.kv_transfer_config),
            lora=(LoRAConfig(self.max_loras, self.max_lora_rank,
                             self.max_loras if self.max_cpu_loras is None else self.max_cpu_loras)
                  if self.enable_lora else None))
        config.verify()
        return config


@functools.cache
def attribute_docs(cls) -> dict[str, str]:
    """Each field's docstring (the string literal under it, as vLLM documents its configs):
    the CLI's help text, written once beside the field."""
    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    return {node.target.id: " ".join(doc.value.value.split())
            for node, doc in zip(body, body[1:])
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
            and isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant)
            and isinstance(doc.value.value, str)}
