"""Which model class serves which Hugging Face architecture."""
from __future__ import annotations

from jaxvllm.models.llama import LlamaArgs, LlamaForCausalLM
from jaxvllm.models.mixtral import MixtralForCausalLM, MoeArgs
from jaxvllm.models.qwen3_moe import Qwen2MoeForCausalLM, Qwen3MoeForCausalLM

_MODELS = {
    "LlamaForCausalLM": (LlamaForCausalLM, LlamaArgs),
    "MistralForCausalLM": (LlamaForCausalLM, LlamaArgs),
    "Qwen2ForCausalLM": (LlamaForCausalLM, LlamaArgs),
    "MixtralForCausalLM": (MixtralForCausalLM, MoeArgs),
    "Qwen2MoeForCausalLM": (Qwen2MoeForCausalLM, MoeArgs),
    "Qwen3MoeForCausalLM": (Qwen3MoeForCausalLM, MoeArgs),
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
