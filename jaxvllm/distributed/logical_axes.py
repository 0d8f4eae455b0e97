"""Logical axes: model code says what each dimension of a weight or activation is (embed,
heads, kv_heads, mlp, experts, vocab, sequence), and one table per mesh layout says which
mesh axis, if any, splits it (MaxText's `logical_axis_rules`, tpu-inference's
ShardingAxisName). A new layout (data-parallel attention, sequence parallelism, a second
expert axis) is then a new table here, not an edit of every model family.

A dimension whose mesh axis an earlier dimension of the same array already took stays
whole: a stack of experts under expert parallelism is split on its experts axis alone,
while a dense MLP on the same mesh keeps its mlp axis split.
"""
from __future__ import annotations

import jax
from jax.sharding import PartitionSpec as P

from jaxvllm.distributed.mesh import MODEL_AXIS

EMBED = "embed"        # the hidden size
HEADS = "heads"        # attention query heads
KV_HEADS = "kv_heads"  # attention key/value heads
MLP = "mlp"            # an MLP's (or an expert's) intermediate features
EXPERTS = "experts"    # a stack of experts
VOCAB = "vocab"        # the vocabulary (embedding rows, LM head columns)
SEQUENCE = "sequence"  # a step's tokens

# The one-axis mesh of mesh.py, Megatron style: q/k/v and gate/up column parallel, o/down row
# parallel, embedding and LM head vocabulary parallel, experts split on their features.
TENSOR_PARALLEL = {HEADS: MODEL_AXIS, KV_HEADS: MODEL_AXIS, MLP: MODEL_AXIS, VOCAB: MODEL_AXIS}
# The same mesh under enable_expert_parallel: whole experts per device, attention as above.
EXPERT_PARALLEL = {EXPERTS: MODEL_AXIS, **TENSOR_PARALLEL}


def axis_rules(mesh_axes: tuple[str, ...], expert_parallel: bool = False) -> dict[str, str]:
    """The table of the layout on a mesh of these axis names."""
    if tuple(mesh_axes) != (MODEL_AXIS,):
        raise ValueError(f"No logical axis rules for a mesh of axes {tuple(mesh_axes)}; known: ({MODEL_AXIS!r},).")
    return EXPERT_PARALLEL if expert_parallel else TENSOR_PARALLEL


def logical_to_mesh(names: tuple[str | None, ...], rules: dict[str, str]) -> P:
    """The PartitionSpec of an array whose dimensions are `names` (None: never split)."""
    used, spec = set(), []
    for name in names:
        axis = rules.get(name) if name is not None else None
        spec.append(axis if axis not in used else None)
        used.add(axis)
    return P(*spec)


def constrain(x: jax.Array, *names: str | None) -> jax.Array:
    """`with_sharding_constraint` of x, whose dimensions are `names`, on the mesh set while
    tracing (`jax.set_mesh`); a no-op without one, so the model also runs unsharded (tests)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return x
    return jax.lax.with_sharding_constraint(x, logical_to_mesh(names, axis_rules(mesh.axis_names)))
