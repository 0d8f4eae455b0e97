"""The model's weights as the step programs take them: one flat tuple, and the head's few.

Every argument of a call costs the host dispatch time, on every step: with the default
model's ~180 weight arrays, most of a call's. So the programs take the weights as a flat
tuple (no pytree to flatten per call), and the sampler and prompt logprobs take only those
`compute_logits` reads (the LM head, a tied embedding, a final projection), found by tracing
it once so that no model has to list them.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import AbstractMesh


class StepParams:
    def __init__(self, graphdef, params: nnx.State, hidden: jax.ShapeDtypeStruct,
                 abstract_mesh: AbstractMesh):
        """hidden: one row of the final hidden states, as compute_logits takes them."""
        leaves, self.treedef = jax.tree.flatten(params)
        self.graphdef = graphdef
        self.shapes = [(x.shape, x.dtype) for x in leaves]

        def logits(leaves, hidden):
            with jax.sharding.use_abstract_mesh(abstract_mesh):
                return self.model(leaves).compute_logits(hidden, jnp.int32(hidden.shape[0]))
        jaxpr = jax.make_jaxpr(logits)([jax.ShapeDtypeStruct(*s) for s in self.shapes], hidden).jaxpr
        used = {id(v) for eqn in jaxpr.eqns for v in eqn.invars} | {id(v) for v in jaxpr.outvars}
        self.head_indices = [i for i, v in enumerate(jaxpr.invars[:len(leaves)]) if id(v) in used]

    def split(self, params: nnx.State) -> tuple[tuple[jax.Array, ...], tuple[jax.Array, ...]]:
        """Every weight leaf, and the head's."""
        leaves = tuple(jax.tree.leaves(params))
        return leaves, tuple(leaves[i] for i in self.head_indices)

    def model(self, leaves) -> nnx.Module:
        """The model over these weight leaves (inside a traced program)."""
        return nnx.merge(self.graphdef, jax.tree.unflatten(self.treedef, list(leaves)))

    def head_model(self, head_leaves) -> nnx.Module:
        """The model with only its head's weights; the others are zeros nothing reads, which
        the compiler drops."""
        leaves = [jnp.zeros(shape, dtype) for shape, dtype in self.shapes]
        for i, x in zip(self.head_indices, head_leaves):
            leaves[i] = x
        return self.model(leaves)
