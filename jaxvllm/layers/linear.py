"""The model's matmuls, and how their weights are stored (vLLM's LinearMethod).

A linear weight is given as [in, *out]; the out axes keep heads and fused parts apart, so
that tensor parallelism can split them (distributed/partition.py). The backend picks one
linear method per model (jaxvllm/backends): it fixes each weight's stored shape at
construction, turns a loaded [in, *out] weight into that form once, and multiplies, giving
the out features in a shape the caller reshapes to the one it needs (free with either
method). This one is XLA's: weights stored as given. The CPU's packed native matmul keeps
the same interface (PackedLinearMethod, jaxvllm/layers/packed_linear.py), and so do the
quantized methods (jaxvllm/layers/quantization/).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp


class UnquantizedLinearMethod:
    """x @ w in XLA, w stored [in, *out] as loaded. accumulate_dtype: what the dot returns
    before the cast back to x's dtype, where the backend asks for it (the CPU: XLA:CPU's
    bfloat16 x bfloat16 -> bfloat16 dot runs at a quarter of the speed of -> float32)."""
    # A tied LM head is the embedding, transposed inside the matmul: no copy is kept.
    copies_tied_head = False
    accumulate_dtype = None

    def __init__(self, accumulate_dtype=None):
        self.accumulate_dtype = accumulate_dtype

    def weight_shape(self, in_features: int, out_shape: tuple[int, ...]) -> tuple[int, ...]:
        return (in_features, *out_shape)

    def supports(self, in_features: int, out_shape: tuple[int, ...], dtype) -> bool:
        return True

    def weight_bytes(self, in_features: int, out_shape: tuple[int, ...], dtype) -> int:
        """What one weight takes on device (the memory plan's figure)."""
        return math.prod(self.weight_shape(in_features, out_shape)) * jnp.dtype(dtype).itemsize

    def process_weights_after_loading(self, w: jax.Array) -> jax.Array:
        return w

    def stored_form(self, w: jax.ShapeDtypeStruct):
        """The abstract weight as this method stores it once loaded (compiling ahead of time)."""
        return jax.eval_shape(self.process_weights_after_loading, w)

    def apply(self, x: jax.Array, w: jax.Array, num_rows: jax.Array | None = None) -> jax.Array:
        """x [..., in] @ w -> [..., *out]. num_rows (how many leading rows of x are real) is
        for kernels that skip bucket padding; XLA computes every row."""
        dims = (((x.ndim - 1,), (0,)), ((), ()))
        if self.accumulate_dtype is None or x.dtype == self.accumulate_dtype:
            return jax.lax.dot_general(x, w, dims)
        return jax.lax.dot_general(x, w, dims, preferred_element_type=self.accumulate_dtype).astype(x.dtype)

    def apply_stacked(self, x: jax.Array, stack: jax.Array, index: int, num_rows: jax.Array | None = None):
        """x @ stack[index], stack: weights stored by this method, stacked on a new first axis
        (LoRA's adapters, over the layers)."""
        return self.apply(x, stack[index], num_rows)


class Linear:
    """A named projection bound to its weight for one forward pass: `layers.3.qkv_proj`
    with the method the quantization config chose for it (QuantizationConfig.
    get_quant_method), so that a quantized, a float and (later) an adapted layer are called
    alike: `w["qkv_proj"](x, num_tokens)`."""
    __slots__ = ("name", "method", "weight")

    def __init__(self, name: str, method, weight):
        self.name, self.method, self.weight = name, method, weight

    def __call__(self, x: jax.Array, num_rows: jax.Array | None = None) -> jax.Array:
        return self.method.apply(x, self.weight, num_rows)
