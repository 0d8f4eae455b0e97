"""load_tokenizer: a resolved model's tokenizer, chat template included, torch-free for GGUF
too. The front end tokenizes and detokenizes with it without importing the model loaders."""
from __future__ import annotations

import transformers

from jaxvllm.transformers_utils.gguf_utils import gguf_reader, hf_source, is_gguf


def load_tokenizer(model: str) -> transformers.PreTrainedTokenizerBase:
    """The tokenizer of a resolved model (see `resolve_model`)."""
    if not is_gguf(source := hf_source(model)):
        tokenizer = transformers.AutoTokenizer.from_pretrained(source)
        tokenizer.name_or_path = model
        return tokenizer
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_TOKENIZER_MAPPING, convert_gguf_tokenizer

    reader = gguf_reader(model)
    # Mirrors transformers' `get_gguf_tokenizer`, whose file reader imports torch.
    meta = {key: field.contents() for key, field in reader.fields.items() if key.startswith("tokenizer.")}
    vocab, kwargs = (
        {name: meta[f"tokenizer.{key}"] for key, name in renames.items() if f"tokenizer.{key}" in meta}
        for renames in (GGUF_TOKENIZER_MAPPING["tokenizer"], GGUF_TOKENIZER_MAPPING["tokenizer_config"])
    )
    if vocab.get("tokenizer_type") == "llama":
        kwargs.setdefault("add_bos_token", True)  # llama.cpp's default for sentencepiece vocabularies
    for special in ("bos", "eos", "unk", "pad"):
        token_id = vocab.get(f"{special}_token_id")
        kwargs[f"{special}_token"] = None if token_id is None else vocab["tokens"][token_id]
    backend, extra = convert_gguf_tokenizer(reader.fields["general.architecture"].contents(), vocab)
    return transformers.TokenizersBackend(tokenizer_object=backend, name_or_path=model, **kwargs, **extra)
