"""The Flax Llama model against Hugging Face transformers (torch, CPU) on tiny random
checkpoints: prefill logits, GQA, tied embeddings, QKV bias and Llama-3 RoPE scaling."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import run_prefill, write_tiny_llama
from flax import nnx

from jaxvllm.models.llama import LlamaArgs, LlamaForCausalLM
from jaxvllm.models.loader import load_weights
from jaxvllm.transformers_utils.config import load_hf_config


def load_both(path):
    hf_config = load_hf_config(str(path))
    model = nnx.eval_shape(lambda: LlamaForCausalLM(LlamaArgs.from_hf_config(hf_config)))
    model.load_hf_weights(load_weights(str(path)))
    from transformers import AutoModelForCausalLM
    ref = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    return model, ref


@pytest.mark.parametrize("variant", [
    dict(),
    dict(hidden_size=96, num_heads=6, num_kv_heads=2),           # GQA ratio 3
    dict(num_heads=4, num_kv_heads=4, tie=True),                 # MHA, tied embeddings
    dict(attention_bias=True),                                   # Qwen2-style QKV bias
    dict(arch="Mistral", sliding_window=24),                     # sliding-window attention
    dict(rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                       "high_freq_factor": 4.0, "original_max_position_embeddings": 32},
         rope_theta=500000.0),
])
def test_prefill_logits_match_transformers(tmp_path, variant):
    cfg, tensors = write_tiny_llama(tmp_path, **variant)
    if variant.get("attention_bias"):  # give the biases real values
        from safetensors.numpy import save_file
        rng = np.random.default_rng(1)
        for i in range(cfg.num_hidden_layers):
            for proj, rows in (("q", cfg.num_attention_heads), ("k", cfg.num_key_value_heads),
                               ("v", cfg.num_key_value_heads)):
                tensors[f"model.layers.{i}.self_attn.{proj}_proj.bias"] = (
                    rng.standard_normal(rows * cfg.head_dim) * 0.1).astype(np.float32)
        save_file(tensors, str(tmp_path / "model.safetensors"))
    model, ref = load_both(tmp_path)
    token_ids = list(np.random.default_rng(0).integers(0, cfg.vocab_size, 70))  # crosses 4 pages
    ours = run_prefill(model, [int(t) for t in token_ids])
    with torch.no_grad():
        theirs = ref(torch.tensor([token_ids])).logits[0].numpy()
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4 * np.abs(theirs).max())
