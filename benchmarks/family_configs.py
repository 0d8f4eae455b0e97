"""Every architecture the registry serves, as a transformers config at one given shape, with the
features that set its family apart (sliding windows, soft caps, q/k norms, experts): what the
family matrix (benchmarks/families.py) times and the in-place test (tests/models/
test_kv_in_place.py) compiles, with abstract or random weights and nothing downloaded.

Mixture-of-experts families get 8 experts, 2 per token, each half the dense MLP's width: the
same active MLP work per token as the dense families at the same shape.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from jaxvllm.models.llama import LlamaArgs  # noqa: E402
from jaxvllm.models.registry import get_model_class, supported_architectures  # noqa: E402

SLIDING_WINDOW = 512  # Gemma 3 270M's


def _features(arch: str, a: LlamaArgs, window: int) -> tuple[str, dict]:
    n, moe_width = a.num_layers, a.intermediate_size // 2
    gemma = dict(head_dim=a.head_dim, query_pre_attn_scalar=a.head_dim, sliding_window=window)
    return {
        "LlamaForCausalLM": ("LlamaConfig", {}),
        "MistralForCausalLM": ("MistralConfig", dict(sliding_window=window)),
        "Qwen2ForCausalLM": ("Qwen2Config", {}),
        "Qwen3ForCausalLM": ("Qwen3Config", dict(head_dim=a.head_dim)),
        # Alternating sliding / global layers, soft-capped scores and logits.
        "Gemma2ForCausalLM": ("Gemma2Config", dict(
            gemma, attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
            layer_types=["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)])),
        # Five sliding layers to one global, counted from the last (Gemma 3 270M's 18 layers:
        # 5, 11 and 17 are global), q/k norms, a rope base per layer type.
        "Gemma3ForCausalLM": ("Gemma3TextConfig", dict(
            gemma, layer_types=["full_attention" if (n - 1 - i) % 6 == 0 else "sliding_attention"
                                for i in range(n)],
            rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                             "full_attention": {"rope_type": "default", "rope_theta": 1e6}})),
        "OPTForCausalLM": ("OPTConfig", {}),
        "Phi3ForCausalLM": ("Phi3Config", {}),
        "MixtralForCausalLM": ("MixtralConfig", dict(num_local_experts=8, num_experts_per_tok=2,
                                                     intermediate_size=moe_width)),
        "Qwen2MoeForCausalLM": ("Qwen2MoeConfig", dict(num_experts=8, num_experts_per_tok=2,
                                                       moe_intermediate_size=moe_width,
                                                       shared_expert_intermediate_size=0)),
        "Qwen3MoeForCausalLM": ("Qwen3MoeConfig", dict(num_experts=8, num_experts_per_tok=2,
                                                       moe_intermediate_size=moe_width, head_dim=a.head_dim)),
    }[arch]


def family_config(arch: str, shape: LlamaArgs, sliding_window: int = SLIDING_WINDOW):
    """arch's transformers config with shape's sizes (OPT: multi-head attention, its
    ffn_dim the intermediate size)."""
    import transformers
    cls, fields = _features(arch, shape, sliding_window)
    if arch == "OPTForCausalLM":
        sizes = dict(vocab_size=shape.vocab_size, hidden_size=shape.hidden_size, ffn_dim=shape.intermediate_size,
                     num_attention_heads=shape.num_heads, num_hidden_layers=shape.num_layers,
                     word_embed_proj_dim=shape.hidden_size)
    else:
        sizes = dict(vocab_size=shape.vocab_size, hidden_size=shape.hidden_size,
                     intermediate_size=shape.intermediate_size, num_hidden_layers=shape.num_layers,
                     num_attention_heads=shape.num_heads, num_key_value_heads=shape.num_kv_heads,
                     tie_word_embeddings=shape.tie_word_embeddings)
    cfg = getattr(transformers, cls)(**{**sizes, **fields}, max_position_embeddings=shape.max_position_embeddings,
                                     eos_token_id=2, bos_token_id=1, pad_token_id=0)
    cfg.architectures = [arch]
    return cfg


def family_args(arch: str, shape: LlamaArgs, sliding_window: int = SLIDING_WINDOW):
    """(model class, its args) of arch at shape."""
    cfg = family_config(arch, shape, sliding_window)
    model_cls, args_cls = get_model_class(cfg)
    return model_cls, args_cls.from_hf_config(cfg)


# The generating families; a *ForSequenceClassification is its causal LM's body and step with a
# score head in place of the LM head.
ARCHITECTURES = [a for a in supported_architectures() if not a.endswith("ForSequenceClassification")]
