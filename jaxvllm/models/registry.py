"""Which model class serves which Hugging Face architecture (the checkpoint config's
`architectures`; vLLM's ModelRegistry): architecture -> (model class, args class)."""
from __future__ import annotations

from jaxvllm.models.gemma import GemmaArgs, GemmaForCausalLM
from jaxvllm.models.llama import LlamaArgs, LlamaForCausalLM
from jaxvllm.models.opt import OPTArgs, OPTForCausalLM
from jaxvllm.models.phi3 import Phi3Args, Phi3ForCausalLM
from jaxvllm.models.qwen3 import Qwen3Args, Qwen3ForCausalLM
from jaxvllm.models.mixtral import MixtralForCausalLM, MoeArgs
from jaxvllm.models.qwen2_moe import Qwen2MoeForCausalLM
from jaxvllm.models.qwen3_moe import Qwen3MoeForCausalLM

_MODELS = {
    "LlamaForCausalLM": (LlamaForCausalLM, LlamaArgs),
    "MistralForCausalLM": (LlamaForCausalLM, LlamaArgs),
    "Qwen2ForCausalLM": (LlamaForCausalLM, LlamaArgs),
    "Qwen3ForCausalLM": (Qwen3ForCausalLM, Qwen3Args),
    "Gemma2ForCausalLM": (GemmaForCausalLM, GemmaArgs),
    "Gemma3ForCausalLM": (GemmaForCausalLM, GemmaArgs),
    "OPTForCausalLM": (OPTForCausalLM, OPTArgs),
    "Phi3ForCausalLM": (Phi3ForCausalLM, Phi3Args),
    "MixtralForCausalLM": (MixtralForCausalLM, MoeArgs),
    "Qwen2MoeForCausalLM": (Qwen2MoeForCausalLM, MoeArgs),
    "Qwen3MoeForCausalLM": (Qwen3MoeForCausalLM, MoeArgs),
}

# A GGUF's config names no architecture, only its model type.
_GGUF_MODEL_TYPES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                     "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                     "gemma2": "Gemma2ForCausalLM", "gemma3_text": "Gemma3ForCausalLM"}


def supported_architectures() -> list[str]:
    return sorted(_MODELS)


def architecture(hf_config) -> str:
    """The architecture that serves hf_config (a GGUF's config names only its model type)."""
    archs = list(getattr(hf_config, "architectures", None) or [])
    for arch in archs:
        if arch in _MODELS:
            return arch
    if not archs and getattr(hf_config, "model_type", None) in _GGUF_MODEL_TYPES:
        return _GGUF_MODEL_TYPES[hf_config.model_type]
    raise ValueError(f"Model architectures {archs or [hf_config.model_type]} are not supported; "
                     f"supported: {', '.join(supported_architectures())}.")


def get_model_class(hf_config):
    return _MODELS[architecture(hf_config)]
