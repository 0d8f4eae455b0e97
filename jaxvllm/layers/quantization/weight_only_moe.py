"""Weight-only quantized experts (vLLM's Fp8MoEMethod / compressed-tensors W8A16 MoE
meaning): each expert's gate/up and down weights in 8 bits with one float32 scale per
(expert, output channel), quantized at load from float experts (`quantization` int8 / fp8) or
stored so in a compressed-tensors checkpoint (as QArrays, kept as they are).

The grouped matmul multiplies the token copies by their experts' 8-bit values, converted to
the activations' dtype; each row's output is then scaled by its expert's channel scales
(exact, as for the dense linears: the scale is constant along the contraction). Where the
conversion happens is the backend's grouped matmul's (layers/fused_moe.py): the CPU's tile
loop converts one expert's matrix per (row tile, expert) pair it visits; `ragged_dot` (GPU)
takes the 8-bit operand and XLA converts it; megablox `gmm` (TPU) multiplies float32 /
bfloat16 only, so XLA converts the layer's experts before the kernel.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import qwix

from jaxvllm.layers.fused_moe import GroupedMatmul, UnquantizedFusedMoEMethod
from jaxvllm.layers.quantization import verify_quantization
from jaxvllm.layers.quantization.weight_only import WEIGHT_DTYPES, quantize_weight


class WeightOnlyFusedMoEMethod(UnquantizedFusedMoEMethod):
    """Experts as QArrays [experts, in, *out], scales [experts, 1, *out]."""

    def __init__(self, quantization: str, grouped_matmul: GroupedMatmul = jax.lax.ragged_dot):
        verify_quantization(quantization)
        super().__init__(grouped_matmul)
        self.qtype = WEIGHT_DTYPES[quantization]

    def process_weights_after_loading(self, w: jax.Array | qwix.QArray) -> jax.Array | qwix.QArray:
        if isinstance(w, qwix.QArray) or self.qtype is None:  # quantized in the checkpoint, or left float
            return w
        # Per expert and output channel: the input axis (1) is the one reduced.
        return quantize_weight(w, self.qtype, (0, *range(2, w.ndim)))

    def weight_bytes(self, shape: tuple[int, ...], dtype=None) -> int:
        """8-bit values, a float32 scale per (expert, output channel)."""
        out = math.prod(shape) // shape[1]
        return math.prod(shape) + out * 4

    def expert_matmul(self, lhs: jax.Array, w, group_sizes: jax.Array, experts: jax.Array) -> jax.Array:
        if not isinstance(w, qwix.QArray):
            return super().expert_matmul(lhs, w, group_sizes, experts)
        E, k = w.shape[:2]
        out = self.grouped_matmul(lhs, w.qvalue.reshape(E, k, -1), group_sizes)
        # Rows past the last group (token copies for other devices' experts) are dropped later.
        return out * w.scale.reshape(E, -1)[jnp.minimum(experts, E - 1)].astype(out.dtype)
