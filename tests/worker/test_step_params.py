"""StepParams: the sampler's programs take only the weights compute_logits reads, and the
model rebuilt from them gives the same logits as the whole one."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import write_tiny_llama
from flax import nnx

from jaxvllm.models.llama import LlamaArgs, LlamaForCausalLM
from jaxvllm.models.loader import load_weights
from jaxvllm.transformers_utils.config import load_hf_config
from jaxvllm.worker.step_params import StepParams


@pytest.mark.parametrize("tie", [False, True])
def test_head_leaves_are_the_lm_head_and_give_the_same_logits(tmp_path, tie):
    write_tiny_llama(tmp_path, tie=tie)
    model = nnx.eval_shape(lambda: LlamaForCausalLM(LlamaArgs.from_hf_config(load_hf_config(str(tmp_path)))))
    model.load_hf_weights(load_weights(str(tmp_path)))
    graphdef, params = nnx.split(model)
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("model",))
    sp = StepParams(graphdef, params, jax.ShapeDtypeStruct((1, 64), jnp.float32), mesh.abstract_mesh)
    leaves, head = sp.split(params)
    # The one weight the head reads: the embedding when tied, else the LM head.
    expected = model.embed_tokens.get_value() if tie else model.lm_head.get_value()
    assert len(head) == 1 and head[0] is expected
    assert len(leaves) == len(jax.tree.leaves(params)) > len(head)

    hidden = jax.random.normal(jax.random.key(0), (3, 64), jnp.float32)

    @jax.jit
    def both(leaves, head, hidden):
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            return sp.model(leaves).compute_logits(hidden), sp.head_model(head).compute_logits(hidden)
    full, from_head = both(leaves, head, hidden)
    np.testing.assert_array_equal(np.asarray(full), np.asarray(from_head))
    # A program over the head alone takes two arguments: the head's weight and the hidden states.
    def head_logits(head, hidden):
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            return sp.head_model(head).compute_logits(hidden)
    text = jax.jit(head_logits).lower(head, hidden).as_text()
    main = next(line for line in text.splitlines() if "func.func public @main(" in line)
    assert main.count("%arg") == 2
