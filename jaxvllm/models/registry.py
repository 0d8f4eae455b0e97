"""Which model class serves which Hugging Face architecture."""
from __future__ import annotations

from jaxvllm.models.llama import LlamaArgs, LlamaForCausalLM

_MODELS = {
    "LlamaForCausalLM": (LlamaForCausalLM, LlamaArgs),
    "MistralForCausalLM": (LlamaForCausalLM, LlamaArgs),
    "Qwen2ForCausalLM": (LlamaForCausalLM, LlamaArgs),
}


def get_model_class(hf_config):
    archs = list(getattr(hf_config, "architectures", None) or [])
    for arch in archs:
        if arch in _MODELS:
            return _MODELS[arch]
    if not archs and getattr(hf_config, "model_type", None) in ("llama", "mistral", "qwen2"):
        return _MODELS["LlamaForCausalLM"]
    raise ValueError(f"Model architectures {archs or [hf_config.model_type]} are not supported; "
                     f"supported: {sorted(_MODELS)}.")
