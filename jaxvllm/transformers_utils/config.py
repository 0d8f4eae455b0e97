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
    if config["model_type"] in ("gemma2", "gemma3"):
        config.update(_gemma_fields(reader, config))
    return transformers.AutoConfig.for_model(**config)


def _gemma_fields(reader, config: dict) -> dict:
    """What a Gemma GGUF leaves to the reader, as llama.cpp fills it in: which layers slide
    (Gemma 2: every other one, from the first; Gemma 3: all but every sixth, unless the file
    states its pattern), the sliding layers' rope base (Gemma 3: 10k), the query scale
    (1/sqrt(head_dim), but 1/sqrt(hidden / heads) for the 27B models) and the soft caps."""
    arch, n = config["model_type"], config["num_hidden_layers"]
    field = lambda key, default=None: (f.contents() if (f := reader.fields.get(f"{arch}.{key}")) is not None
                                       else default)
    pattern = field("attention.sliding_window_pattern", 2 if arch == "gemma2" else 6)
    if isinstance(pattern, list):  # newer files: one flag per layer
        sliding = [bool(x) for x in pattern]
    else:
        sliding = [(i + 1) % pattern != 0 for i in range(n)]
    big = n == (46 if arch == "gemma2" else 62)  # the 27B models
    out = dict(layer_types=["sliding_attention" if s else "full_attention" for s in sliding],
               query_pre_attn_scalar=config["hidden_size"] // config["num_attention_heads"] if big
               else config["head_dim"])
    if arch == "gemma2":
        out.update(attn_logit_softcapping=field("attn_logit_softcapping", 50.0),
                   final_logit_softcapping=field("final_logit_softcapping", 30.0))
        return out
    full = {"rope_type": "default", "rope_theta": config.pop("rope_theta")}
    if field("rope.scaling.type") == "linear":
        full.update(rope_type="linear", factor=field("rope.scaling.factor"))
    out.update(model_type="gemma3_text", rope_parameters={
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}, "full_attention": full})
    return out
