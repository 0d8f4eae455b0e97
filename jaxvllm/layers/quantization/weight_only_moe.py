"""Quantized experts (vLLM's Fp8MoEMethod / compressed-tensors W8A16 / AWQ / GPTQ MoE
meaning): each expert's gate/up and down weights as a QArray [experts, in, *out] with scales
[experts, groups, *out]: 8 bits per output channel quantized at load from float experts
(`quantization` int8 / fp8), or a quantized checkpoint's as stored (its WeightScheme).

Per output channel, the grouped matmul multiplies the token copies by their experts' values
converted to the activations' dtype; each row's output is then scaled by its expert's channel
scales (exact, as for the dense linears: the scale is constant along the contraction). Where
the conversion happens is the backend's grouped matmul's (layers/fused_moe.py): the CPU's tile
loop converts one expert's matrix per (row tile, expert) pair it visits; `ragged_dot` (GPU)
takes the 8-bit operand and XLA converts it; megablox `gmm` (TPU) multiplies float32 /
bfloat16 only, so XLA converts the layer's experts before the kernel. Group scales and zero
points vary along the contraction: the experts are dequantized into the grouped matmul's
operand (quantized_matmul.dequantize). Act order is not supported in experts.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import qwix

from jaxvllm.layers.fused_moe import GroupedMatmul, UnquantizedFusedMoEMethod
from jaxvllm.layers.quantization import verify_quantization
from jaxvllm.layers.quantization.quantized_matmul import dequantize
from jaxvllm.layers.quantization.scheme import WeightScheme
from jaxvllm.layers.quantization.weight_only import WEIGHT_DTYPES, quantize_weight


class WeightOnlyFusedMoEMethod(UnquantizedFusedMoEMethod):
    """Experts as QArrays [experts, in, *out], scales [experts, groups, *out]."""

    def __init__(self, quantization: str, grouped_matmul: GroupedMatmul = jax.lax.ragged_dot,
                 scheme: WeightScheme | None = None, int4_bytes: float = 0.5):
        verify_quantization(quantization)
        super().__init__(grouped_matmul)
        self.scheme, self.int4_bytes = scheme, int4_bytes
        self.qtype = WEIGHT_DTYPES.get(quantization) if scheme is None else None

    def process_weights_after_loading(self, w: jax.Array | qwix.QArray) -> jax.Array | qwix.QArray:
        if isinstance(w, tuple):
            raise ValueError("Experts quantized with act order (g_idx) are not supported.")
        if isinstance(w, qwix.QArray) or self.qtype is None:  # quantized in the checkpoint, or left float
            return w
        # Per expert and output channel: the input axis (1) is the one reduced.
        return quantize_weight(w, self.qtype, (0, *range(2, w.ndim)))

    def weight_bytes(self, shape: tuple[int, ...], dtype=None) -> int:
        """The values, a float32 scale (and zero point) per (expert, group, output channel)."""
        out, s = math.prod(shape) // shape[1], self.scheme
        if s is None:
            return math.prod(shape) + out * 4
        value = math.prod(shape) * (self.int4_bytes if s.bits == 4 else 1)
        return int(value) + s.groups(shape[1]) * out * 4 * (1 + s.zero_point)

    def stored_form(self, w: jax.ShapeDtypeStruct):
        """The abstract stack as loaded and stored (compiling ahead of time holds this)."""
        s = self.scheme
        if s is None:
            return jax.eval_shape(self.process_weights_after_loading, w)
        scale = jax.ShapeDtypeStruct((w.shape[0], s.groups(w.shape[1]), *w.shape[2:]), jnp.float32)
        return qwix.QArray(jax.ShapeDtypeStruct(w.shape, jnp.dtype(s.qtype)), scale, scale if s.zero_point else None)

    def expert_matmul(self, lhs: jax.Array, w, group_sizes: jax.Array, experts: jax.Array) -> jax.Array:
        if not isinstance(w, qwix.QArray):
            return super().expert_matmul(lhs, w, group_sizes, experts)
        E, k = w.shape[:2]
        if w.scale.shape[1] > 1 or w.zero_point is not None or w.qvalue.dtype not in (jnp.int8, jnp.float8_e4m3fn):
            return self.grouped_matmul(lhs, dequantize(w, lhs.dtype, in_axis=1).reshape(E, k, -1), group_sizes)
        out = self.grouped_matmul(lhs, w.qvalue.reshape(E, k, -1), group_sizes)
        # Rows past the last group (token copies for other devices' experts) are dropped later.
        return out * w.scale.reshape(E, -1)[jnp.minimum(experts, E - 1)].astype(out.dtype)
