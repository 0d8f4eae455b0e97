"""Mixture-of-experts models against Hugging Face transformers on tiny random checkpoints
written by transformers: prefill logits for Mixtral, Qwen3-MoE and Qwen2-MoE (shared expert);
the grouped-matmul layer against its dense reference; the loader's errors."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from conftest import run_prefill, write_tiny_moe
from flax import nnx

from jaxvllm.layers.fused_moe import UnquantizedFusedMoEMethod, dense_moe, select_experts
from jaxvllm.models.loader import load_weights
from jaxvllm.models.registry import get_model_class
from jaxvllm.transformers_utils.config import load_hf_config


def load_ours(path, weights=None):
    hf_config = load_hf_config(str(path))
    model_cls, args_cls = get_model_class(hf_config)
    model = nnx.eval_shape(lambda: model_cls(args_cls.from_hf_config(hf_config)))
    model.load_hf_weights(load_weights(str(path)) if weights is None else weights)
    return model


@pytest.mark.parametrize("arch", ["Mixtral", "Qwen3Moe", "Qwen2Moe"])
def test_prefill_logits_match_transformers(tmp_path, arch):
    cfg = write_tiny_moe(tmp_path, arch)
    from transformers import AutoModelForCausalLM
    ref = AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
    token_ids = [int(t) for t in np.random.default_rng(0).integers(0, cfg.vocab_size, 70)]
    ours = run_prefill(load_ours(tmp_path), token_ids)
    with torch.no_grad():
        theirs = ref(torch.tensor([token_ids])).logits[0].numpy()
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4 * np.abs(theirs).max())


@pytest.mark.parametrize("renormalize", [True, False])
def test_grouped_matmul_matches_dense_reference(renormalize):
    """Every expert's share sums to the whole: what each device adds up under expert
    parallelism (first_expert: its experts' numbering)."""
    rng = np.random.default_rng(0)
    T, H, I, E, k = 13, 32, 24, 8, 2
    x = jnp.asarray(rng.standard_normal((T, H)), jnp.float32)
    w_gate_up = jnp.asarray(rng.standard_normal((E, H, 2, I)) * 0.2, jnp.float32)
    w_down = jnp.asarray(rng.standard_normal((E, I, H)) * 0.2, jnp.float32)
    logits = jnp.asarray(rng.standard_normal((T, E)), jnp.float32)
    method = UnquantizedFusedMoEMethod()

    @jax.jit  # one compile instead of one per operation
    def run(x, w_gate_up, w_down, logits):
        weights, ids = select_experts(logits, k, renormalize)
        shares = sum(method.apply(x, w_gate_up[e:e + 2], w_down[e:e + 2], weights, ids, first_expert=e)
                     for e in range(0, E, 2))
        return (weights, method.apply(x, w_gate_up, w_down, weights, ids), shares,
                dense_moe(x, w_gate_up, w_down, weights, ids))

    weights, grouped, shares, reference = run(x, w_gate_up, w_down, logits)
    if renormalize:
        np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-6)
    else:
        assert bool((weights.sum(-1) < 1).all())
    np.testing.assert_allclose(grouped, reference, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(shares, reference, rtol=1e-5, atol=1e-5)


def test_checkpoint_errors_name_the_tensor(tmp_path):
    write_tiny_moe(tmp_path, "Mixtral")
    weights = load_weights(str(tmp_path))
    key = "model.layers.1.block_sparse_moe.experts.3.w2.weight"
    with pytest.raises(ValueError, match=f"missing tensor '{key}'"):
        load_ours(tmp_path, {n: w for n, w in weights.items() if n != key})
    with pytest.raises(ValueError, match=rf"'{key}' has shape \(64, 95\); the model config needs \(64, 96\)"):
        load_ours(tmp_path, {**weights, key: weights[key][:, :95]})


def test_dense_layers_between_moe_layers_are_refused(tmp_path):
    write_tiny_moe(tmp_path, "Qwen3Moe", mlp_only_layers=[0])
    with pytest.raises(ValueError, match=r"mlp_only_layers=\[0\]"):
        load_ours(tmp_path)
