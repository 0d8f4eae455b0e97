"""Backend: what one engine's step runs with, resolved once from its EngineConfig and its
Platform, so that the worker, the runners, `aot_compile` and `memory_plan` are handed the
choices instead of asking for them again with a string.

It holds the attention kernel and the KV cache it reads (layout, shape, storage format), the
linear and mixture-of-experts methods (for the engine's `quantization`, and in float for a
draft model and LoRA adapters), the layer loop and the sampler's argmax. These are the
accelerators' (TPU and GPU) choices; cpu.py and tpu.py override what differs there.
"""
from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from jaxvllm.config import EngineConfig
from jaxvllm.kernels.xla.argmax import first_argmax
from jaxvllm.layers.attention import get_attention
from jaxvllm.layers.fused_moe import UnquantizedFusedMoEMethod
from jaxvllm.layers.kv_cache_dtype import kv_cache_dtype
from jaxvllm.layers.linear import UnquantizedLinearMethod
from jaxvllm.layers.quantization.scheme import WeightScheme
from jaxvllm.models.layer_loops import unrolled_layers
from jaxvllm.platforms import Platform

ATTENTION_BACKENDS = ("xla", "native", "pallas", "pallas-tpu", "pallas-gpu")


class Backend:
    # How the model runs its layers: unrolled in Python, one static layer index each, so the
    # step holds no loop or conditional (what tpu-inference, sglang-jax and MaxText's
    # serving path do).
    layer_loop = staticmethod(unrolled_layers)
    # The sampler's argmax over the vocabulary, x [R, V] -> i32[R]: XLA's reduction.
    sampler_argmax = staticmethod(first_argmax)

    def __init__(self, config: EngineConfig, platform: Platform):
        self.platform = platform
        # `xla`, `native`, `tpu` or `gpu`; interpret: a Pallas kernel off its own device.
        self.attention_kernel, self.interpret = self.resolve_attention(config.model.attention_backend)
        self.kv_dtype = kv_cache_dtype(config.cache.kv_cache_dtype, jnp.dtype(config.dtype),
                                       platform.kv_cache_floats_as_bits)
        tp = config.parallel.tensor_parallel_size  # every mesh of the engine (a stage's too) is this size
        scheme = config.quant_config.weights
        self.linear_method = self.get_linear_method(config.quantization, config.dtype, tp, scheme)
        self.moe_method = self.get_moe_method(config.quantization, tp, scheme)
        # A draft model's and the LoRA adapters' (they load unquantized).
        self.float_linear_method = self.get_linear_method(None, config.dtype, tp)
        self.float_moe_method = self.get_moe_method(None, tp)

    # ---- attention ------------------------------------------------------------------
    def resolve_attention(self, name: str) -> tuple[str, bool]:
        """(kernel, interpret) for an `attention_backend`; `auto` picks this device's fastest."""
        if name not in ("auto",) + ATTENTION_BACKENDS:
            raise ValueError(f"attention_backend must be one of {('auto',) + ATTENTION_BACKENDS}, got {name!r}.")
        if name == "auto":
            name = self.auto_attention_backend()
        if name == "native":
            return self.native_attention()
        if name == "xla":
            return "xla", False
        pallas = self.platform.pallas_kernel
        kernel = name.removeprefix("pallas-") if name != "pallas" else pallas or "tpu"
        return kernel, kernel != pallas

    def auto_attention_backend(self) -> str:
        return "pallas"

    def native_attention(self) -> tuple[str, bool]:
        raise ValueError(f"attention_backend='native' runs on the CPU only, not on {self.platform.device_name!r}.")

    @functools.cached_property
    def attention_impl(self) -> Callable:
        """The kernel function (the contract of jaxvllm/kernels/xla/ragged_paged_attention.py)."""
        return self.load_attention_kernel()

    def load_attention_kernel(self) -> Callable:
        """The chosen kernel's function, its module imported only here."""
        layout = self.platform.kv_cache_layout
        if self.attention_kernel == "xla":
            from jaxvllm.kernels.xla.ragged_paged_attention import ragged_paged_attention
            return functools.partial(ragged_paged_attention, kv_layout=layout)
        if self.attention_kernel == "tpu":
            from pallas_kernels.ragged_paged_attention_tpu import ragged_paged_attention as tpu
            return functools.partial(tpu, interpret=self.interpret, kv_layout=layout)
        from pallas_kernels.ragged_paged_attention_gpu import ragged_paged_attention as gpu
        return functools.partial(gpu, interpret=self.interpret)

    def attention(self, mesh: Mesh | None = None) -> Callable:
        """The model's attention call on `mesh` (layers/attention.py's get_attention)."""
        return get_attention(self.attention_impl, self.platform.kv_cache_layout, mesh, self.kv_dtype)

    def kv_cache_shape(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int,
                       head_dim: int) -> tuple[int, ...]:
        """The KV cache array's shape: [layers, 2 (K, V), blocks, block_size, kv_heads,
        head_dim]. A device's own layout keeps the blocks axis third (swap, prefix pages,
        KV transfer copy whole blocks) and a slot's K (or V) last."""
        return (num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim)

    # ---- matmuls --------------------------------------------------------------------
    # What XLA stores a 4-bit value in here: TPU and GPU pack two in a byte.
    int4_bytes = 0.5

    def get_linear_method(self, quantization: str | None, dtype: str, num_devices: int,
                          scheme: WeightScheme | None = None):
        """How the model's matmuls run and store their weights (jaxvllm/layers/linear.py):
        XLA's; with `quantization`, quantized weights (int8 / fp8 at load, or a checkpoint's
        `scheme`) multiplied by XLA (jaxvllm/layers/quantization/weight_only.py). dtype: the
        model's."""
        if quantization is not None:
            from jaxvllm.layers.quantization.weight_only import WeightOnlyLinearMethod
            return WeightOnlyLinearMethod(quantization, scheme, self.int4_bytes)
        return UnquantizedLinearMethod()

    def get_moe_method(self, quantization: str | None, num_devices: int, scheme: WeightScheme | None = None):
        """How a mixture-of-experts layer runs its experts (jaxvllm/layers/fused_moe.py): the
        grouped matmul over the token copies sorted by expert; with `quantization`, quantized
        experts (jaxvllm/layers/quantization/weight_only_moe.py)."""
        if quantization is not None:
            from jaxvllm.layers.quantization.weight_only_moe import WeightOnlyFusedMoEMethod
            return WeightOnlyFusedMoEMethod(quantization, self.grouped_matmul(), scheme, self.int4_bytes)
        return UnquantizedFusedMoEMethod(self.grouped_matmul())

    def grouped_matmul(self) -> Callable:
        """The experts' grouped matmul (contract: jaxvllm/layers/fused_moe.py): XLA's `ragged_dot`."""
        return jax.lax.ragged_dot
