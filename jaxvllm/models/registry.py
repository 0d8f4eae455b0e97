"""Which model class serves which Hugging Face architecture (the checkpoint config's
`architectures`; vLLM's ModelRegistry): architecture -> (module, class, args class), imported
when asked for. A new family is its file under models/ and its line here."""
from __future__ import annotations

import importlib

_MODELS = {
    "LlamaForCausalLM": ("llama", "LlamaForCausalLM", "LlamaArgs"),
    "MistralForCausalLM": ("llama", "LlamaForCausalLM", "LlamaArgs"),
    "Qwen2ForCausalLM": ("llama", "LlamaForCausalLM", "LlamaArgs"),
    "Qwen3ForCausalLM": ("qwen3", "Qwen3ForCausalLM", "Qwen3Args"),
    "Gemma2ForCausalLM": ("gemma", "GemmaForCausalLM", "GemmaArgs"),
    "Gemma3ForCausalLM": ("gemma", "GemmaForCausalLM", "GemmaArgs"),
    "OPTForCausalLM": ("opt", "OPTForCausalLM", "OPTArgs"),
    "Phi3ForCausalLM": ("phi3", "Phi3ForCausalLM", "Phi3Args"),
    "MixtralForCausalLM": ("mixtral", "MixtralForCausalLM", "MoeArgs"),
    "Qwen2MoeForCausalLM": ("qwen2_moe", "Qwen2MoeForCausalLM", "MoeArgs"),
    "Qwen3MoeForCausalLM": ("qwen3_moe", "Qwen3MoeForCausalLM", "MoeArgs"),
}
# Draft heads, which serve only as speculative decoding's draft of a target model.
_DRAFT_MODELS = {
    "LlamaForCausalLMEagle3": ("eagle3", "Eagle3LlamaForCausalLM", "Eagle3Args"),
    "Eagle3LlamaForCausalLM": ("eagle3", "Eagle3LlamaForCausalLM", "Eagle3Args"),
}
# Checkpoints with a score head instead of the LM head: the family's decoder as a classifier
# (models/adapters.py), served by the pooling runner.
_SEQ_CLS = {"LlamaForSequenceClassification": "LlamaForCausalLM",
            "MistralForSequenceClassification": "MistralForCausalLM",
            "Qwen2ForSequenceClassification": "Qwen2ForCausalLM",
            "Qwen3ForSequenceClassification": "Qwen3ForCausalLM"}

# A GGUF's config names no architecture, only its model type.
_GGUF_MODEL_TYPES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                     "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                     "gemma2": "Gemma2ForCausalLM", "gemma3_text": "Gemma3ForCausalLM"}


def supported_architectures() -> list[str]:
    return sorted(_MODELS | _SEQ_CLS)


def architecture(hf_config) -> str:
    """The architecture that serves hf_config (a GGUF's config names only its model type)."""
    archs = list(getattr(hf_config, "architectures", None) or [])
    for arch in archs:
        if arch in _MODELS or arch in _SEQ_CLS or arch in _DRAFT_MODELS:
            return arch
    if not archs and getattr(hf_config, "model_type", None) in _GGUF_MODEL_TYPES:
        return _GGUF_MODEL_TYPES[hf_config.model_type]
    raise ValueError(f"Model architectures {archs or [hf_config.model_type]} are not supported; "
                     f"supported: {', '.join(supported_architectures())}.")


def get_model_class(hf_config) -> tuple[type, type]:
    """(model class, args class) of hf_config's architecture."""
    arch = architecture(hf_config)
    module, model_cls, args_cls = {**_MODELS, **_DRAFT_MODELS}[_SEQ_CLS.get(arch, arch)]
    module = importlib.import_module(f"jaxvllm.models.{module}")
    classes = getattr(module, model_cls), getattr(module, args_cls)
    if arch in _SEQ_CLS:
        from jaxvllm.models.adapters import as_seq_cls_model
        return as_seq_cls_model(*classes)
    return classes


def is_draft_model(hf_config) -> bool:
    """Whether hf_config is a draft head (EAGLE-3), which serves only beside its target."""
    return any(arch in _DRAFT_MODELS for arch in getattr(hf_config, "architectures", None) or [])
