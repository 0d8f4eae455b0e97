"""Tiny random checkpoints of each model family beyond Llama, written by transformers
(`from_config(...).save_pretrained`, float32) with the default model's tokenizer; the tests
prompt them with token ids below the tiny vocabulary."""
from __future__ import annotations

import torch

COMMON = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=512, eos_token_id=2, bos_token_id=1,
              pad_token_id=0)

# architecture -> (config class, config fields): each family's features, tiny.
FAMILIES = {
    "Qwen3ForCausalLM": ("Qwen3Config", dict(COMMON, num_hidden_layers=2, head_dim=16,
                                              tie_word_embeddings=False)),
    "Gemma2ForCausalLM": ("Gemma2Config", dict(
        COMMON, num_hidden_layers=3, head_dim=32, query_pre_attn_scalar=24, sliding_window=12,
        attn_logit_softcapping=5.0, final_logit_softcapping=3.0)),
    "Gemma3ForCausalLM": ("Gemma3TextConfig", dict(
        COMMON, num_hidden_layers=3, head_dim=32, query_pre_attn_scalar=24, sliding_window=12,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                         "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}})),
    "OPTForCausalLM": ("OPTConfig", dict(
        vocab_size=256, hidden_size=64, ffn_dim=128, num_attention_heads=4, num_hidden_layers=2,
        word_embed_proj_dim=32, max_position_embeddings=512, eos_token_id=2, bos_token_id=1,
        pad_token_id=0)),
    "Phi3ForCausalLM": ("Phi3Config", dict(COMMON, num_hidden_layers=2, tie_word_embeddings=False)),
}
# The Llama class's other architectures, for the tests that cover every registered one
# (test_families runs FAMILIES only: Llama has tests of its own).
LLAMA_FAMILIES = {
    "LlamaForCausalLM": ("LlamaConfig", dict(COMMON, num_hidden_layers=2, tie_word_embeddings=True)),
    "MistralForCausalLM": ("MistralConfig", dict(COMMON, num_hidden_layers=2, sliding_window=None,
                                                  tie_word_embeddings=False)),
    "Qwen2ForCausalLM": ("Qwen2Config", dict(COMMON, num_hidden_layers=2, tie_word_embeddings=False)),
}


def write_family_checkpoint(arch: str, path, seed: int = 0, **overrides):
    """A random checkpoint of arch in path; returns the transformers model (float32, eval).
    Weights are redrawn larger than transformers' init so that greedy choices are not near
    ties; norm weights stay near their identity (1, or 0 where Gemma adds 1)."""
    import transformers

    from jaxvllm.transformers_utils.model_path import default_model_path
    from jaxvllm.transformers_utils.tokenizer import load_tokenizer

    classifier = arch.endswith("ForSequenceClassification")  # the family's decoder, a score head
    cls, fields = {**FAMILIES, **LLAMA_FAMILIES}[arch.replace("ForSequenceClassification", "ForCausalLM")]
    cfg = getattr(transformers, cls)(**{**fields, **({"num_labels": 3} if classifier else {}), **overrides})
    cfg.architectures = [arch]
    torch.manual_seed(seed)
    auto = transformers.AutoModelForSequenceClassification if classifier else transformers.AutoModelForCausalLM
    model = auto.from_config(cfg, dtype=torch.float32, attn_implementation="eager")
    gemma = arch.startswith("Gemma")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.copy_((0.0 if gemma else 1.0) + 0.1 * torch.randn_like(p))
            elif "embed" in name:
                p.copy_((0.1 if gemma else 0.5) * torch.randn_like(p))
            else:
                p.copy_(0.08 * torch.randn_like(p))
    model.save_pretrained(path)
    load_tokenizer(default_model_path()).save_pretrained(path)
    return model.eval()


def write_checkpoint(arch: str, path) -> None:
    """A tiny random checkpoint of any registered architecture (models/registry.py)."""
    from conftest import MOE_FAMILIES, write_tiny_moe
    moe = arch.removesuffix("ForCausalLM")
    if moe in MOE_FAMILIES:
        write_tiny_moe(path, moe)
    else:
        write_family_checkpoint(arch, path)
