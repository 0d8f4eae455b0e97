"""What fits a device, from shapes alone: weight bytes, KV bytes per block, and the blocks a
memory budget holds, per device, for a weight format (`quantization`) and a KV format
(`kv_cache_dtype`), as the engine's backend (jaxvllm/backends) stores them on that device.
The worker logs the same figures at start-up; this prints them before anything is allocated:

    python -m jaxvllm.memory_plan --shape llama3-8b --quantization int8 --kv-cache-dtype fp8 \\
        --device-memory 16GiB --max-model-len 8192

A model with sliding-window layers (Gemma 2 and 3, Mistral) gets its KV cache groups as the
engine forms them (core/kv_cache_interface.py), and the requests that fit are counted with
each sliding group holding its window only, beside the count if every layer kept every page.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import re

import jax.numpy as jnp

from jaxvllm.backends import Backend, get_backend
from jaxvllm.config import KV_CACHE_DTYPES, CacheConfig, EngineConfig, ModelConfig, ParallelConfig, SchedulerConfig
from jaxvllm.config import QuantizationConfig as QuantizationSection
from jaxvllm.core.kv_cache_interface import KVCacheSpec, blocks_per_request, describe_groups, group_layers
from jaxvllm.layers.quantization import QUANTIZATION_METHODS
from jaxvllm.layers.quantization.config import QuantizationConfig
from jaxvllm.layers.quantization.scheme import WeightScheme
from jaxvllm.models.causal_lm import layer_windows
from jaxvllm.models.weight_spec import EXPERTS, LINEAR, expand
from jaxvllm.platforms import get_platform

GiB = 2**30


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    """Bytes per device (weights and KV heads split evenly over tensor_parallel_size)."""
    matmul_weight_bytes: int     # the linear layers' and experts' weights (what `quantization` shrinks)
    other_weight_bytes: int      # embedding, norms, biases, routers
    kv_bytes_per_block: int
    kv_budget_bytes: int
    num_blocks: int
    block_size: int
    max_model_len: int
    groups: str = ""              # the KV cache groups, described
    blocks_per_request: int = 0   # what one request of max_model_len holds (0: every layer, every page)
    kv_bytes_per_token_all_layers: int = 0  # for the count without sliding windows

    @property
    def weight_bytes(self) -> int:
        return self.matmul_weight_bytes + self.other_weight_bytes

    @property
    def max_full_length_seqs(self) -> int:
        """Requests of max_model_len tokens that fit at once (block 0 is the null block)."""
        return (self.num_blocks - 1) // (self.blocks_per_request or -(-self.max_model_len // self.block_size))

    @property
    def max_full_length_seqs_without_windows(self) -> int:
        """The same if every layer kept every page (no KV cache groups)."""
        block = self.kv_bytes_per_token_all_layers * self.block_size
        return max(self.kv_budget_bytes // block - 1, 0) // -(-self.max_model_len // self.block_size)

    def lines(self) -> list[str]:
        mib = lambda n: f"{n / 2**20:,.1f} MiB"
        tokens = "" if self.blocks_per_request else f"{(self.num_blocks - 1) * self.block_size:,} tokens; "
        fit = (f"blocks that fit: {self.num_blocks:,} ({tokens}"
               f"{self.max_full_length_seqs} requests of {self.max_model_len} tokens)"
               if self.num_blocks >= 2 else "blocks that fit: none (the weights leave no room for a KV cache)")
        lines = [f"weights: {mib(self.weight_bytes)} ({mib(self.matmul_weight_bytes)} in matmuls)",
                 f"KV cache: {mib(self.kv_budget_bytes)} budget, {self.kv_bytes_per_block:,} bytes per block "
                 f"of {self.block_size} tokens", fit]
        if self.blocks_per_request:
            lines.append(f"KV cache groups: {self.groups}; a request of {self.max_model_len} tokens holds "
                         f"{self.blocks_per_request:,} blocks; without sliding windows "
                         f"{self.max_full_length_seqs_without_windows} requests would fit")
        return lines


def engine_config(*, dtype: str = "bfloat16", quantization: str | None = None, kv_cache_dtype: str = "auto",
                  hbm_utilization: float = 0.9, block_size: int = 16, max_model_len: int = 8192,
                  tensor_parallel_size: int = 1, weight_scheme: WeightScheme | None = None) -> EngineConfig:
    """The config sections a plan reads, from the flags below (no checkpoint is read)."""
    return EngineConfig(model=ModelConfig(dtype=dtype), quant_config=QuantizationSection(quantization, weight_scheme),
                        cache=CacheConfig(block_size=block_size, hbm_utilization=hbm_utilization,
                                          kv_cache_dtype=kv_cache_dtype),
                        scheduler=SchedulerConfig(max_model_len=max_model_len),
                        parallel=ParallelConfig(tensor_parallel_size=tensor_parallel_size))


def weight_bytes(model_cls, args, quant_config: QuantizationConfig, dtype) -> tuple[int, int]:
    """(matmul weights and experts, the rest) in bytes for the whole model, from its weight
    spec: each weight as the method the quantization config picks for it stores it."""
    matmul = other = 0
    for path, w in expand(model_cls.weight_spec(args), range(args.num_layers)).items():
        method = quant_config.get_quant_method(w, path)
        if w.kind == LINEAR:
            if w.tied_to is None or method.copies_tied_head:
                matmul += method.weight_bytes(w.shape[0], w.shape[1:], dtype)
        elif w.kind == EXPERTS:
            matmul += method.weight_bytes(w.shape, dtype)
        else:
            other += w.num_elements * jnp.dtype(dtype).itemsize
    return matmul, other


def kv_bytes_per_block(args, block_size: int, backend: Backend) -> int:
    """Every layer's page of K and V, in the backend's layout and storage."""
    shape = backend.kv_cache_shape(args.num_layers, 1, block_size, args.num_kv_heads, args.head_dim)
    return math.prod(shape) * backend.kv_dtype.storage.itemsize


def kv_cache_groups(args, block_size: int, max_model_len: int):
    """The KV cache groups the engine would form (pages of 1 byte: only their count matters)."""
    specs = {f"layers.{i}.self_attn": KVCacheSpec(block_size, 1, w if w is not None and w < max_model_len else None)
             for i, w in enumerate(layer_windows(args))}
    return group_layers(specs)


def plan(model_cls, args, config: EngineConfig, backend: Backend, device_memory: int) -> MemoryPlan:
    """The plan for one device of `device_memory` bytes for an engine of this config and
    backend: the KV cache gets hbm_utilization of it less the weights, as the worker sizes it
    (activations are not counted)."""
    tp, block_size = config.parallel.tensor_parallel_size, config.cache.block_size
    max_model_len = config.scheduler.max_model_len
    quant_config = QuantizationConfig(backend.linear_method, backend.moe_method)
    matmul, other = weight_bytes(model_cls, args, quant_config, config.dtype)
    all_layers = kv_bytes_per_block(args, block_size, backend)
    groups = kv_cache_groups(args, block_size, max_model_len)
    block = all_layers * max(len(g.layer_names) for g in groups) // args.num_layers
    matmul, other, block = -(-matmul // tp), -(-other // tp), -(-block // tp)
    budget = int(device_memory * config.cache.hbm_utilization) - matmul - other
    hybrid = len(groups) > 1 or groups[0].kv_cache_spec.sliding_window is not None
    return MemoryPlan(matmul, other, block, max(budget, 0), max(budget // block, 0), block_size, max_model_len,
                      groups=describe_groups(groups),
                      blocks_per_request=blocks_per_request(groups, max_model_len) if hybrid else 0,
                      kv_bytes_per_token_all_layers=-(-all_layers // tp) // block_size)


def parse_bytes(text: str) -> int:
    m = re.fullmatch(r"\s*([\d.]+)\s*([KMGT]i?B?)?\s*", text, re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"--device-memory: expected a size like 16GiB, got {text!r}")
    unit = (m.group(2) or "").upper().rstrip("B").rstrip("I")
    return int(float(m.group(1)) * 1024 ** " KMGT".index(unit or " "))


def parse_scheme(text: str) -> WeightScheme:
    """QTYPE[:GROUP_SIZE][:zp], e.g. uint4:128:zp (AWQ's usual), int4:128 (GPTQ), float8_e4m3fn:128."""
    qtype, *rest = text.split(":")
    zero_point = rest[-1:] == ["zp"]
    group = rest[:len(rest) - zero_point]
    try:
        return WeightScheme(qtype, int(group[0]) if group else 0, zero_point=zero_point)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"--weight-scheme: {e}") from None


# Formats that describe a checkpoint: how many bits and groups depends on the checkpoint.
CHECKPOINT_FORMATS = ("awq", "gptq")


def main(argv=None) -> None:
    from jaxvllm.models.gemma import GemmaArgs, GemmaForCausalLM
    from jaxvllm.models.llama import LlamaForCausalLM
    from jaxvllm.models.shapes import SHAPES

    p = argparse.ArgumentParser(prog="python -m jaxvllm.memory_plan", description=__doc__.split("\n\n")[0],
                                allow_abbrev=False)
    p.add_argument("--shape", choices=sorted(SHAPES), default="llama3-8b")
    p.add_argument("--platform", choices=("tpu", "cuda", "cpu"), default="tpu",
                   help="the device whose backend stores the weights and KV cache")
    p.add_argument("--quantization", choices=QUANTIZATION_METHODS, default=None)
    p.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default="auto")
    p.add_argument("--dtype", default="bfloat16", help="weights and activations (the platform's on TPU/GPU)")
    p.add_argument("--device-memory", type=parse_bytes, required=True, help="per device, e.g. 16GiB")
    p.add_argument("--hbm-utilization", type=float, default=0.9)
    p.add_argument("--block-size", type=int, default=None, help="tokens per KV block (default: the platform's)")
    p.add_argument("--max-model-len", type=int, default=8192)
    p.add_argument("--tensor-parallel-size", type=int, default=1)
    p.add_argument("--weight-scheme", type=parse_scheme, default=None,
                   help="a quantized checkpoint's stored weights, QTYPE[:GROUP_SIZE][:zp] (needed with awq and "
                        "gptq; with fp8 or compressed-tensors, blocks or 4 bits), e.g. uint4:128:zp")
    ns = p.parse_args(argv)
    if ns.quantization == "gguf":
        p.error("--quantization gguf: a .gguf file's tensors each have their own type; plan it from the file "
                "(jaxvllm compile --model FILE.gguf).")
    if ns.quantization in CHECKPOINT_FORMATS and ns.weight_scheme is None:
        p.error(f"--quantization {ns.quantization} describes a checkpoint's own format: give its --weight-scheme "
                f"(e.g. uint4:128:zp for AWQ, int4:128 for GPTQ).")
    if ns.weight_scheme is not None and ns.quantization not in (*CHECKPOINT_FORMATS, "fp8", "compressed-tensors"):
        p.error(f"--weight-scheme describes a quantized checkpoint; --quantization {ns.quantization} has none.")
    args = SHAPES[ns.shape]
    config = engine_config(dtype=ns.dtype, quantization=ns.quantization, kv_cache_dtype=ns.kv_cache_dtype,
                           hbm_utilization=ns.hbm_utilization,
                           block_size=ns.block_size or get_platform(ns.platform).default_block_size,
                           max_model_len=ns.max_model_len, tensor_parallel_size=ns.tensor_parallel_size,
                           weight_scheme=ns.weight_scheme)
    model_cls = GemmaForCausalLM if isinstance(args, GemmaArgs) else LlamaForCausalLM
    result = plan(model_cls, args, config, get_backend(config, get_platform(ns.platform)), ns.device_memory)
    print(f"{ns.shape}, {ns.dtype}, quantization={ns.quantization}, kv_cache_dtype={ns.kv_cache_dtype}, "
          f"{ns.device_memory / GiB:g} GiB x {ns.hbm_utilization} per device, TP={ns.tensor_parallel_size}:")
    for line in result.lines():
        print("  " + line)


if __name__ == "__main__":
    main()
