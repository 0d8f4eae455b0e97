"""load_hf_config: a resolved model's Hugging Face config, torch-free for GGUF too. The front
end reads it (limits, vocabulary) without importing the model loaders."""
from __future__ import annotations

import transformers

from jaxvllm.transformers_utils.gguf_utils import check_gguf_arch, gguf_reader, hf_source, is_gguf


def load_hf_config(model: str) -> transformers.PretrainedConfig:
    """The Hugging Face config of a resolved model (see `resolve_model`)."""
    if not is_gguf(source := hf_source(model)):
        return transformers.AutoConfig.from_pretrained(source)
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING  # only here: imports take 0.3 s

    reader = gguf_reader(model)
    check_gguf_arch(model, reader)
    # What transformers' (torch-importing) GGUF config loader does for these architectures.
    config = {}
    for key, field in reader.fields.items():
        prefix, _, rest = key.partition(".")
        name = GGUF_CONFIG_MAPPING.get(prefix, {}).get(rest)
        if name is not None:
            config[name] = field.contents()
    config["tie_word_embeddings"] = "output.weight" not in {t.name for t in reader.tensors}
    if (key_length := reader.fields.get(f"{config['model_type']}.attention.key_length")) is not None:
        config["head_dim"] = key_length.contents()  # Qwen3's is not hidden_size / heads
    if "vocab_size" not in config:  # older files state it only as the token list's length
        config["vocab_size"] = len(reader.fields["tokenizer.ggml.tokens"].data)
    return transformers.AutoConfig.for_model(**config)
