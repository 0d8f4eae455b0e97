"""The time a forward step cannot beat on a chip, from what it must move and compute: a
roofline prediction for `jaxvllm compile`, not a measurement.

XLA's cost analysis is no basis for it: it cannot see inside the Pallas attention kernel
(whose KV reads are most of a long-context decode step's bytes), and its `bytes accessed` sums
every fusion's operands and outputs, so weights and activations that stay in VMEM or are
fused away count again (Llama-3-8B's forward at T=64 on a v5e-8 chip: 7.66 GB against
2.0 GB of weights). Here a step of `tokens` tokens in `seqs` sequences, each reading
`context` tokens of KV, moves per chip:
- every weight once (for MoE layers, the experts that `tokens` x top-k choices are expected
  to touch);
- the KV the attention reads (each sliding-window layer at most its window) and writes;
- each layer's activations written and read once (the residual stream, q/k/v, the attention
  output, the MLP's intermediates) and the sampled rows' logits;
and computes XLA's counted flops (the matmuls) plus the attention's QK and PV products.
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class StepBytes:
    weights: float
    kv_read: float
    kv_write: float
    activations: float

    @property
    def total(self) -> float:
        return self.weights + self.kv_read + self.kv_write + self.activations


def _windows(args) -> list[int | None]:
    from jaxvllm.models.causal_lm import layer_windows
    return layer_windows(args)


def expected_experts(num_experts: int, top_k: int, tokens: int) -> float:
    """Distinct experts `tokens` tokens choosing top_k each touch, if choices were uniform."""
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** tokens)


def step_bytes(args, *, tokens: int, seqs: int, context: int, weight_bytes: float, expert_bytes: float,
               kv_bytes_per_token_layer: float, dtype_bytes: int, tp: int) -> StepBytes:
    """Per chip. weight_bytes: all of a chip's weights; expert_bytes: the part of them in
    routed experts; kv_bytes_per_token_layer: a token's K and V of one layer on one chip, in
    the platform's layout."""
    experts = getattr(args, "num_experts", 0) or 0
    if experts:
        touched = expected_experts(experts, args.num_experts_per_tok, tokens) / experts
        weight_bytes = weight_bytes - expert_bytes * (1.0 - touched)
    read = sum(min(context, w) if w else context for w in _windows(args))
    q, kv = args.num_heads * args.head_dim, 2 * args.num_kv_heads * args.head_dim
    mlp = getattr(args, "intermediate_size", 0) * 3
    if experts:
        mlp = getattr(args, "moe_intermediate_size", 0) * 3 * args.num_experts_per_tok
    per_layer = 4 * args.hidden_size + q + kv + q + mlp
    activations = 2 * tokens * per_layer * args.num_layers * dtype_bytes / tp + seqs * args.vocab_size * 4 / tp
    return StepBytes(weights=weight_bytes, kv_read=seqs * read * kv_bytes_per_token_layer,
                     kv_write=tokens * args.num_layers * kv_bytes_per_token_layer, activations=activations)


def attention_flops(args, *, tokens: int, context: int, tp: int) -> float:
    """QK and PV of every query head over the KV it reads, per chip: the kernel's, which XLA
    does not count (each token sees about `context` tokens)."""
    read = sum(min(context, w) if w else context for w in _windows(args))
    return 4.0 * tokens * read * args.num_heads * args.head_dim / tp


def predict(args, chip, *, xla_flops: float, **shape) -> dict:
    """predicted_s with its parts: the larger of bytes over HBM bandwidth and flops over the
    chip's peak."""
    b = step_bytes(args, **shape)
    flops = xla_flops + attention_flops(args, tokens=shape["tokens"], context=shape["context"], tp=shape["tp"])
    return dict(predicted_s=max(b.total / chip.hbm_bytes_per_s, flops / chip.peak_flops),
                bytes_moved=b.total, weights_read=b.weights, kv_read_bytes=b.kv_read, flops_total=flops)
