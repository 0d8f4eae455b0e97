"""Mixture-of-experts MLP (vLLM's FusedMoE): route each token to its top-k experts, run the
experts as one grouped matmul over the token copies sorted by expert, and sum each token's
expert outputs weighted by its router probabilities.

Expert weights are stacked: gate/up `[experts, hidden, 2, intermediate]` (one matmul reads a
row once for both halves) and down `[experts, intermediate, hidden]`. The grouped matmul is
the backend's (`Backend.moe_method`): `jax.lax.ragged_dot` by default (the GPU), Pallas
megablox `gmm` on a TPU; on one CPU device the native kernel over experts packed as the packed
linear method packs a weight (jaxvllm/kernels/cpu/packed_matmul.py), elsewhere on the CPU a
loop over the row tiles each expert's rows occupy. The experts do not go through the linear
method: a grouped matmul needs every expert's weight in one stacked array.

On a mesh the layer runs per device (`shard_map` over the model axis). The hidden states are
replicated between layers, so every device already holds every token: with tensor
parallelism each device runs all experts on its slice of their intermediate features; with
expert parallelism (`expert_parallel`) it runs its own experts on all their features and
skips token copies routed elsewhere. Either way one all-reduce sums the devices' outputs, the
same collective a dense MLP's row-parallel down projection needs; no all-to-all is needed
because no token has to travel to reach an expert.
"""
from __future__ import annotations

import math
from typing import Callable

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from jaxvllm.distributed.logical_axes import EMBED, EXPERTS, MLP, axis_rules, logical_to_mesh

# The stacks' logical axes (distributed/logical_axes.py), for the weight specs that declare them.
GATE_UP_AXES = (EXPERTS, EMBED, None, MLP)  # [experts, hidden, 2, intermediate]
DOWN_AXES = (EXPERTS, MLP, EMBED)           # [experts, intermediate, hidden]

# grouped_matmul(lhs [m, k], rhs [groups, k, n], group_sizes i32[groups]) -> [m, n]: rows of
# lhs in consecutive groups, group g multiplied by rhs[g]; rows past the last group are
# undefined (ragged_dot writes zeros, megablox leaves them unwritten), and dropped below. rhs
# may be 8-bit (quantized experts, layers/quantization/weight_only_moe.py): each implementation
# converts it to lhs's dtype.
# Implementations: jax.lax.ragged_dot, jaxvllm/kernels/{xla,pallas}/grouped_matmul*.py.
GroupedMatmul = Callable[[jax.Array, jax.Array, jax.Array], jax.Array]


def select_experts(router_logits: jax.Array, top_k: int, renormalize: bool) -> tuple[jax.Array, jax.Array]:
    """(weights [tokens, top_k] float32, expert ids [tokens, top_k]): softmax over all experts,
    then the top k; renormalized, the weights are the softmax of the top-k logits (Mixtral
    always; Qwen-MoE where `norm_topk_prob`)."""
    logits = router_logits.astype(jnp.float32)
    if renormalize:
        top, ids = jax.lax.top_k(logits, top_k)
        return jax.nn.softmax(top, axis=-1), ids
    top, ids = jax.lax.top_k(jax.nn.softmax(logits, axis=-1), top_k)
    return top, ids


class UnquantizedFusedMoEMethod:
    """Experts in the checkpoint's dtype, through a grouped matmul (vLLM's name)."""

    def __init__(self, grouped_matmul: GroupedMatmul = jax.lax.ragged_dot):
        self.grouped_matmul = grouped_matmul

    def weight_shape(self, shape: tuple[int, ...], dtype) -> tuple[int, ...]:
        """How a stack of experts declared [experts, in, *out] is stored."""
        return shape

    def process_weights_after_loading(self, w: jax.Array) -> jax.Array:
        return w

    def stored_form(self, w: jax.ShapeDtypeStruct):
        """The abstract stack as this method stores it once loaded (compiling ahead of time)."""
        return jax.eval_shape(self.process_weights_after_loading, w)

    def weight_bytes(self, shape: tuple[int, ...], dtype) -> int:
        """What one stack of experts takes on device (the memory plan's figure)."""
        return math.prod(shape) * jnp.dtype(dtype).itemsize

    def expert_matmul(self, lhs: jax.Array, w: jax.Array, group_sizes: jax.Array, experts: jax.Array) -> jax.Array:
        """lhs [rows, k], rows sorted by expert (experts: each row's), times its expert's
        w [experts, k, *out]: [rows, prod(out)]."""
        return self.grouped_matmul(lhs, w.reshape(*w.shape[:2], -1), group_sizes)

    def apply(self, x: jax.Array, w_gate_up: jax.Array, w_down: jax.Array, topk_weights: jax.Array,
              topk_ids: jax.Array, first_expert: jax.Array | int = 0) -> jax.Array:
        """x [tokens, hidden] through the experts w_gate_up/w_down hold, numbered from
        first_expert (a device's share under expert parallelism); token copies routed to
        other experts contribute nothing. Returns [tokens, hidden] in x's dtype. Only the
        stacks' first axis (experts) is read here: the method stores the rest."""
        (T, k), E = topk_ids.shape, w_gate_up.shape[0]
        expert = topk_ids.reshape(-1) - first_expert
        local = (expert >= 0) & (expert < E)
        expert = jnp.where(local, expert, E)  # others sort after every local group
        order = jnp.argsort(expert, stable=True)
        group_sizes = jnp.bincount(expert, length=E + 1)[:E].astype(jnp.int32)
        token, experts = order // k, expert[order]
        gate_up = self.expert_matmul(x[token], w_gate_up, group_sizes, experts)
        gate_up = gate_up.reshape(gate_up.shape[0], 2, -1)
        out = self.expert_matmul(jax.nn.silu(gate_up[:, 0]) * gate_up[:, 1], w_down, group_sizes, experts)
        weight = jnp.where(local, topk_weights.reshape(-1), 0)[order]
        out = jnp.where(weight[:, None] != 0, out * weight[:, None].astype(out.dtype), 0)
        return jnp.zeros((T, out.shape[-1]), out.dtype).at[token].add(out).astype(x.dtype)


def dense_moe(x: jax.Array, w_gate_up: jax.Array, w_down: jax.Array, topk_weights: jax.Array,
              topk_ids: jax.Array) -> jax.Array:
    """The reference: every expert over every token, combined with each token's router
    weights (zero for experts it was not routed to)."""
    E = w_gate_up.shape[0]
    combine = (jax.nn.one_hot(topk_ids, E, dtype=jnp.float32) * topk_weights[..., None]).sum(1)
    gate_up = jnp.einsum("th,ehci->etci", x, w_gate_up)
    out = jnp.einsum("eti,eih->eth", jax.nn.silu(gate_up[:, :, 0]) * gate_up[:, :, 1], w_down)
    return jnp.einsum("eth,te->th", out, combine.astype(out.dtype)).astype(x.dtype)


def fused_moe(method: UnquantizedFusedMoEMethod, x: jax.Array, w_gate_up: jax.Array, w_down: jax.Array,
              topk_weights: jax.Array, topk_ids: jax.Array, expert_parallel: bool = False) -> jax.Array:
    """The experts' output for replicated x, per device on the mesh set while tracing (see
    the module's docstring); directly without one. Under expert parallelism the experts
    divide over the mesh (distributed/partition.py refuses them otherwise)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.size == 1:
        return method.apply(x, w_gate_up, w_down, topk_weights, topk_ids)
    rules = axis_rules(mesh.axis_names, expert_parallel)
    axis = rules[EXPERTS if expert_parallel else MLP]  # the axis the devices' outputs are summed over
    # Intermediate features that do not divide over the mesh stay replicated (fit_spec):
    # then every device runs every expert whole.
    if not expert_parallel and w_gate_up.shape[-1] % mesh.shape[axis]:
        return method.apply(x, w_gate_up, w_down, topk_weights, topk_ids)
    specs = (_per_array(w_gate_up, logical_to_mesh(GATE_UP_AXES, rules)),
             _per_array(w_down, logical_to_mesh(DOWN_AXES, rules)))

    def local(x, w_gate_up, w_down, topk_weights, topk_ids):
        first = jax.lax.axis_index(axis) * w_gate_up.shape[0] if expert_parallel else 0
        return jax.lax.psum(method.apply(x, w_gate_up, w_down, topk_weights, topk_ids, first), axis)

    return jax.shard_map(local, mesh=mesh, in_specs=(P(), *specs, P(), P()), out_specs=P(),
                         check_vma=False)(x, w_gate_up, w_down, topk_weights, topk_ids)


def _per_array(w, spec: P):
    """spec for w, or for each array of a quantized w (a QArray: its scale's input axis, of
    size 1, is not split)."""
    return jax.tree.map(lambda a: P(*(None if n == 1 else axis for axis, n in zip(spec, a.shape))), w)
